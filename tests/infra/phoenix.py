"""A real OpenTelemetry trace collector for tests: Arize Phoenix (PyPI ``arize-phoenix``),
which receives OTLP over HTTP and gRPC, stores the spans and serves them back by REST.
``scripts/install-deps.sh`` installs it in a virtual environment of its own (its
dependencies pin versions ours must not share); ``DYNAMOCTL_PHOENIX_VENV`` names another
such environment (the script's variable too)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.infra.ports import free_port

VENV = Path(os.environ.get("DYNAMOCTL_PHOENIX_VENV", Path.home() / ".cache/dynamoctl/phoenix"))
PHOENIX = str(VENV / "bin" / "phoenix")
START_S = 120.0
"""Phoenix imports a web stack and migrates its SQLite database: 30 s at load 8."""


@dataclass
class Collector:
    url: str
    """Where OTLP over HTTP is received (spans posted to ``/v1/traces`` under it)."""

    def spans(self, trace_id: str) -> list[dict[str, Any]]:
        """Every span of ``trace_id`` the collector stored (Phoenix's REST API)."""
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if cursor:
                params["cursor"] = cursor
            page = httpx.get(f"{self.url}/v1/projects/default/spans", params=params).json()
            found += [s for s in page["data"] if s["context"]["trace_id"] == trace_id]
            cursor = page.get("next_cursor")
            if not cursor:
                return found


@contextmanager
def phoenix(workdir: Path) -> Iterator[Collector]:
    """A Phoenix server on free loopback ports, its data in ``workdir``."""
    assert Path(PHOENIX).exists(), f"{PHOENIX} missing: run scripts/install-deps.sh"
    port, grpc = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = open(workdir / "phoenix.log", "wb")  # noqa: SIM115 - lives with the process
    proc = subprocess.Popen([PHOENIX, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, f"phoenix exited: see {workdir}/phoenix.log"
            assert time.monotonic() < deadline, f"phoenix not up in {START_S} s"
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        yield Collector(url)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
