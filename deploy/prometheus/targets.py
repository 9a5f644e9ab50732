"""Write Prometheus file_sd targets for every dynamoctl process registered in discovery.

    python deploy/prometheus/targets.py --discovery embedded:///STATE/discovery \\
        --namespace local --out /etc/prometheus/dynamoctl.json [--every 15]

Workers, frontends and routers publish their ``/metrics`` URL in their discovery record
(``metrics_url``); a process that serves several instances (``--num-workers``) is listed
once. The file is replaced atomically, so Prometheus never reads half of it. Scrape it
with ``honor_labels: true`` (see docs/metrics.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from dynamoctl import wire
from dynamoctl.discovery import Discovery, store_from_url


async def targets(disc: Discovery, namespace: str) -> list[dict[str, object]]:
    groups: dict[tuple[str, str], dict[str, object]] = {}
    for value in (await disc.list(f"{namespace}/instances/")).values():
        record = wire.decode_json(value, wire.InstanceRecord)
        if not record.metrics_url:
            continue
        url = urlsplit(record.metrics_url)
        key = (f"{url.hostname}:{url.port}", record.component)
        labels = {"component": record.component, "namespace": namespace}
        if record.label:
            labels["dynamoctl_label"] = record.label
        if url.path != "/metrics":
            labels["__metrics_path__"] = url.path
        groups[key] = {"targets": [key[0]], "labels": labels}
    return [groups[k] for k in sorted(groups)]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--discovery", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--every", type=float, default=0, help="seconds; 0: write once")
    args = parser.parse_args()
    out = Path(args.out)
    async with Discovery(store_from_url(args.discovery), lease_ttl=10) as disc:
        while True:
            found = await targets(disc, args.namespace)
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(found, indent=1) + "\n")
            os.replace(tmp, out)
            print(f"{len(found)} targets -> {out}", flush=True)
            if not args.every:
                return
            await asyncio.sleep(args.every)


if __name__ == "__main__":
    asyncio.run(main())
