"""Rate-limit accuracy (issue 31): a key driven far over its tokens-per-minute gets 429s,
and what it is served stays within 1 % of its limit; another key beside it is unaffected.

    python benchmarks/rate_limits.py [--seconds 60] [--tpm 30000] [--frontends 1]
                                     [--out benchmarks/results/rate_limits.json]

One mocker worker process and one frontend with a key file of two keys: ``greedy``
(``tokens_per_minute: TPM``) whose closed-loop clients ask for about three times its
limit, sleeping each 429's ``retry-after-ms`` as OpenAI's clients do, and ``other``
(unlimited, two sessions). Phases: ``other`` alone, then both for ``--seconds``.

Measured: the prompt plus completion tokens (each answer's ``usage``) served to
``greedy``. Its bucket starts full (one minute's worth), so over T seconds it may be
served ``TPM * (1 + T / 60)``; the error is the tokens served beyond (or short of) that,
over the ``TPM * T / 60`` the window refills. The same error is given for the window from
its first 429 (its bucket empty) to the end, against ``TPM`` per minute alone. ``other``:
its 429s (0 expected) and its latency p50 beside ``greedy`` over alone.

``--frontends N`` (N > 1): N frontend processes, each on its own port, sharing the keys'
limits (``--shared-limits N``, frontend/tenants/shared.py, as ``up`` runs several); each
key's sessions take the frontends in turn, so every one serves ``greedy``. The result is
the row ``frontends_N`` of the output file (the rest kept), with the bound the docs state:
never more than one process would serve, and less by at most one grant (1 % of the limit)
per process. ``--unshared``: the same N frontends counting alone (row
``frontends_N_unshared``), what the deployment served before the limits were shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from cluster import MODEL, NS, _wait_workers
from machine import machine

from dynamoctl.discovery import Discovery, store_from_url
from dynamoctl.frontend.tenants.shared import GRANT_SHARE
from dynamoctl.wire.records import InstanceRecord, decode_json

KEYS = """\
keys:
  - {name: greedy, key: sk-bench-greedy, limits: {tokens_per_minute: %d}}
  - {name: other, key: sk-bench-other}
"""
GREEDY_CLIENTS, OTHER_CLIENTS, WORDS, MAX_TOKENS = 4, 2, 40, 40


class Client:
    """One key's closed-loop sessions and what they saw."""

    def __init__(self, http: httpx.AsyncClient, url: list[str], key: str) -> None:
        self.http, self.url = http, url
        self.headers = {"Authorization": f"Bearer {key}"}
        self.served: list[tuple[float, float, int]] = []
        """(start, end, prompt + completion tokens) of every answered request."""
        self.refused: list[float] = []
        """When each 429 came."""
        self.errors = 0

    async def session(self, index: int, stop: float) -> None:
        url = self.url[index % len(self.url)]
        turn = 0
        while time.monotonic() < stop:
            turn += 1
            body = {"model": MODEL, "prompt": f"session {index} turn {turn} " + "word " * WORDS,
                    "max_tokens": MAX_TOKENS, "ignore_eos": True}  # fmt: skip
            start = time.monotonic()
            try:
                resp = await self.http.post(
                    f"{url}/v1/completions", json=body, headers=self.headers
                )
            except httpx.HTTPError:
                self.errors += 1
                await asyncio.sleep(0.1)
                continue
            if resp.status_code == 429:
                self.refused.append(start)
                # As OpenAI's client: retry-after-ms first, then Retry-After.
                wait_ms = resp.headers.get("retry-after-ms")
                wait = float(wait_ms) / 1000 if wait_ms else float(resp.headers["retry-after"])
                await asyncio.sleep(wait)
                continue
            if resp.status_code != 200:
                self.errors += 1
                continue
            usage = resp.json()["usage"]
            self.served.append(
                (start, time.monotonic(), usage["prompt_tokens"] + usage["completion_tokens"])
            )


def p50_ms(client: Client) -> float | None:
    took = sorted(end - start for start, end, _ in client.served)
    return round(1000 * took[len(took) // 2], 1) if took else None


async def measure(url: list[str], tpm: int, seconds: float) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=32)) as http:
        alone = Client(http, url, "sk-bench-other")
        stop = time.monotonic() + min(10.0, seconds)
        await asyncio.gather(*(alone.session(i, stop) for i in range(OTHER_CLIENTS)))
        greedy = Client(http, url, "sk-bench-greedy")
        other = Client(http, url, "sk-bench-other")
        t0 = time.monotonic()
        stop = t0 + seconds
        await asyncio.gather(
            *(greedy.session(i, stop) for i in range(GREEDY_CLIENTS)),
            *(other.session(100 + i, stop) for i in range(OTHER_CLIENTS)),
        )
    rate = tpm / 60.0
    served = sum(tokens for start, _, tokens in greedy.served if start < stop)
    allowed = tpm + rate * seconds
    first_429 = min(greedy.refused) if greedy.refused else None
    steady: dict[str, Any] = {}
    if first_429 is not None:
        window = stop - first_429
        in_window = sum(tokens for start, _, tokens in greedy.served if start >= first_429)
        steady = {
            "window_s": round(window, 2),
            "tokens_served": in_window,
            "tokens_per_minute": round(in_window / window * 60, 1),
            "error": round(in_window / (rate * window) - 1, 4),
        }
    return {
        "greedy": {
            "tpm_limit": tpm,
            "tokens_served": served,
            "tokens_allowed": round(allowed),
            "error": round((served - allowed) / (rate * seconds), 4),
            "requests_served": len(greedy.served),
            "max_request_tokens": max((tokens for _, _, tokens in greedy.served), default=0),
            "requests_429": len(greedy.refused),
            "first_429_s": None if first_429 is None else round(first_429 - t0, 2),
            "after_first_429": steady,
            "errors": greedy.errors,
        },
        "other": {
            "requests_served": len(other.served),
            "requests_429": len(other.refused),
            "errors": other.errors,
            "latency_p50_alone_ms": p50_ms(alone),
            "latency_p50_beside_greedy_ms": p50_ms(other),
        },
    }


async def frontend_urls(discovery: str, count: int) -> list[str]:
    async with Discovery(store_from_url(discovery), lease_ttl=2) as disc:
        for _ in range(600):
            found = await disc.list(f"{NS}/instances/frontend/")
            if len(found) >= count:
                return sorted(decode_json(v, InstanceRecord).address for v in found.values())
            await asyncio.sleep(0.1)
    raise TimeoutError("the frontends did not register")


async def run(tpm: int, seconds: float, frontends: int, unshared: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "keys.yaml").write_text(KEYS % tpm)
        discovery = f"embedded://{tmp}/disc"
        common = ["--namespace", NS, "--discovery", discovery]
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dynamoctl", "worker", "--model", MODEL, "--block-size", "16",
            "--num-workers", "2", "--speedup-ratio", "10", *common,
            stderr=asyncio.subprocess.DEVNULL)]  # fmt: skip
        try:
            await _wait_workers(discovery, 2)
            shared = ["--shared-limits", str(frontends)] if frontends > 1 and not unshared else []
            for _ in range(frontends):
                procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "dynamoctl", "frontend", "--port", "0",
                    "--api-keys-file", f"{tmp}/keys.yaml", *shared, *common,
                    stderr=asyncio.subprocess.DEVNULL))  # fmt: skip
            urls = await frontend_urls(discovery, frontends)
            async with httpx.AsyncClient() as http:
                for url in urls:
                    for _ in range(600):  # the model is served once the frontend saw a worker
                        models = await http.get(
                            f"{url}/v1/models", headers={"Authorization": "Bearer sk-bench-other"}
                        )
                        if MODEL in models.text:
                            break
                        await asyncio.sleep(0.2)
            return await measure(urls, tpm, seconds)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                await proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--tpm", type=int, default=30000)
    parser.add_argument("--frontends", type=int, default=1)
    parser.add_argument("--unshared", action="store_true", help="each frontend counts alone")
    parser.add_argument("--out", default="benchmarks/results/rate_limits.json")
    args = parser.parse_args()
    n = args.frontends
    result = {
        **asyncio.run(run(args.tpm, args.seconds, n, args.unshared)),
        "machine": machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "deployment": "1 worker process x 2 mocker instances (--speedup-ratio 10), "
        + (
            f"{n} frontends sharing the limits, each session on one in turn"
            if n > 1
            else "1 frontend"
        ),
        "workload": f"greedy: {GREEDY_CLIENTS} closed-loop sessions, ~{WORDS + 4}-word prompts, "
        f"{MAX_TOKENS} tokens, each 429's retry-after-ms slept; other: {OTHER_CLIENTS} sessions "
        f"alike, unlimited; {args.seconds} s",
        "goal": "greedy's |error| <= 0.01 (tokens served beyond or short of TPM * (1 + T/60), "
        "over TPM * T/60); other's requests_429 == 0",
    }
    if n > 1 and not args.unshared:
        grant = max(1, args.tpm * GRANT_SHARE)
        served, allowed = result["greedy"]["tokens_served"], result["greedy"]["tokens_allowed"]
        in_flight = GREEDY_CLIENTS * result["greedy"]["max_request_tokens"]
        result["bound"] = {
            "tokens_low": round(allowed - n * grant),
            "tokens_high": allowed + in_flight,
            "within": allowed - n * grant <= served <= allowed + in_flight,
            "why": f"never more than one frontend would serve (the allowed plus what the "
            f"{GREEDY_CLIENTS} requests in flight use beyond the bucket), less by at most one "
            f"unspent grant ({grant:g} tokens) per frontend",
        }
    if n > 1:
        out = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        out[f"frontends_{n}" + ("_unshared" if args.unshared else "")] = result
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    else:
        old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
        rows = {k: v for k, v in old.items() if k.startswith("frontends_")}
        Path(args.out).write_text(json.dumps({**result, **rows}, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("greedy", "other")}, indent=1))


if __name__ == "__main__":
    main()
