"""A minimal supervisor for the Slurm tests: run inside an allocation (``SLURM_JOB_ID`` set).

    python tests/slurm/supervisor.py RECORDS LOGDIR MARKER

Starts instances ``a`` and ``b`` on the allocation's first node with the SlurmLauncher from
the environment it was given, writes their process records to RECORDS (JSON, once all are
started), then waits for them.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import msgspec

from dynamoctl.launch.api import InstanceSpec
from dynamoctl.launch.slurm.launcher import SlurmLauncher

INSTANCE = (
    "import sys, time; print('hello from', sys.argv[1], flush=True); "
    "print('to stderr from', sys.argv[1], file=sys.stderr, flush=True); time.sleep(600)"
)


async def main(records: Path, logs: Path, marker: str) -> int:
    launcher = SlurmLauncher()
    node = (await launcher.allocation_nodes())[0]
    specs = [
        InstanceSpec(
            name=name,
            pool=name,
            component="worker",
            host=node,
            argv=[sys.executable, "-c", INSTANCE, name, marker],
        )
        for name in ("a", "b")
    ]
    await launcher.preflight(specs)
    started = [await launcher.start(spec, logs / f"{spec.name}.log") for spec in specs]
    tmp = records.with_suffix(".tmp")
    tmp.write_bytes(
        msgspec.json.encode({s.name: p.record for s, p in zip(specs, started, strict=True)})
    )
    tmp.rename(records)
    codes = await asyncio.gather(*(proc.wait() for proc in started))
    return max(codes)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])))
