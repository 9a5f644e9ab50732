"""LMCache's multi-process server next to a vLLM worker: the host-memory KV tier of vLLM's
CPU build (docs/engines.md, "KV offload").

vLLM 0.32's native offloading refuses its CPU build; LMCache 0.5.6 in multi-process mode
works with it. The worker starts one LMCache server per vLLM engine, as a child process
in its own process group, before the engine; vLLM reaches it through
``LMCacheMPConnector``. The server's output goes to the worker's log with an
``[lmcache/PORT]`` prefix; on stop it gets SIGTERM, then SIGKILL after a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from typing import Any, Final

from dynamoctl.engines.api import EngineError

log = logging.getLogger(__name__)

ENV: Final = {
    "LMCACHE_TRACK_USAGE": "false",  # it otherwise posts usage telemetry outside
    "VLLM_ENABLE_V1_MULTIPROCESSING": "1",  # the MP connector crashes in-process
}
"""Environment vLLM needs to use the server (set in the worker before vLLM starts)."""
READY_TIMEOUT_S: Final = 120.0
STOP_TIMEOUT_S: Final = 10.0


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class LMCacheServer:
    """One LMCache multi-process server holding ``l1_gib`` of KV in host memory, LRU, and
    with ``disk_path`` a second tier of files there (LMCache's ``fs`` L2 adapter: every
    chunk stored in L1 is written there too, and a lookup L1 misses is served from it)."""

    def __init__(
        self,
        l1_gib: float,
        chunk_size: int,
        host: str = "127.0.0.1",
        disk_path: str | None = None,
    ) -> None:
        self.host = host
        self.l1_bytes = int(l1_gib * 2**30)
        """Host memory it holds KV in (LMCache's ``--l1-size-gb`` counts GiB)."""
        self.port = _free_port(host)
        self.http_port = _free_port(host)
        self.argv = [
            sys.executable, "-m", "lmcache.v1.multiprocess.http_server",
            "--host", host, "--port", str(self.port),
            "--http-host", host, "--http-port", str(self.http_port),
            "--l1-size-gb", f"{l1_gib:g}", "--eviction-policy", "LRU",
            "--chunk-size", str(chunk_size), "--max-workers", "1",
            # Without it vLLM's connector waits 300 s for a transfer mode it never gets.
            "--supported-transfer-mode", "auto", "--disable-observability",
        ]  # fmt: skip
        if disk_path is not None:  # its import needs aiofiles (scripts/install-deps.sh)
            adapter = {"type": "fs", "base_path": disk_path}
            self.argv += ["--l2-adapter", json.dumps(adapter)]
        self._proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None

    def kv_transfer_config(self) -> dict[str, Any]:
        """vLLM's ``--kv-transfer-config`` for this server."""
        return {
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "lmcache.mp.host": f"tcp://{self.host}",
                "lmcache.mp.port": self.port,
            },
        }

    async def start(self) -> None:
        """Start the server; return once it accepts connections (:class:`EngineError` if
        it exits or is not ready within ``READY_TIMEOUT_S``)."""
        self._proc = proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **ENV},
            start_new_session=True,  # its own group: stopped whole, spared our signals
        )
        tail: list[str] = []
        self._pump = asyncio.get_running_loop().create_task(self._relay(tail))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not await self._accepts():
            if proc.returncode is not None or time.monotonic() > deadline:
                await self.stop()
                why = f"exited {proc.returncode}" if proc.returncode is not None else "not ready"
                raise EngineError(
                    f"LMCache server ({' '.join(self.argv[:3])}) {why} within "
                    f"{READY_TIMEOUT_S:.0f}s: {' | '.join(tail[-5:])}"
                )
            await asyncio.sleep(0.2)
        log.info("[lmcache/%d] ready (pid %d)", self.port, proc.pid)

    async def _accepts(self) -> bool:
        try:
            _, writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def _relay(self, tail: list[str]) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        async for raw in self._proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            tail[:] = [*tail[-19:], line]
            log.info("[lmcache/%d] %s", self.port, line)

    async def stop(self) -> None:
        """SIGTERM to its group, SIGKILL after ``STOP_TIMEOUT_S``; idempotent."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
                except asyncio.TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    await proc.wait()
        finally:
            if self._pump is not None:
                self._pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._pump
                self._pump = None
