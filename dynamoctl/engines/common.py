"""Pieces shared by the real-engine adapters: engine argument aliases, free ports, a load
estimate for engines whose own scheduler statistics we do not read, and a watch on the
processes an engine started."""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from dynamoctl.engines.api import EngineDied
from dynamoctl.wire.engine import LoadMetrics

DEATH_POLL = 0.25
"""Seconds between looks for an engine's death where nothing wakes us up."""


def translate(
    options: Mapping[str, Any], aliases: Mapping[str, str], engine: str
) -> dict[str, Any]:
    """``options`` with dynamoctl's names (vLLM's, which the supervisor derives from a
    recipe's ``model`` section for every engine) replaced by the engine's own
    (``aliases``); one setting given under both names with different values is refused."""
    out = {k: v for k, v in options.items() if k not in aliases}
    for ours, theirs in aliases.items():
        if ours not in options:
            continue
        if theirs in options and options[theirs] != options[ours]:
            raise ValueError(
                f"{engine} engine arguments: --{ours.replace('_', '-')} {options[ours]!r} "
                f"and --{theirs.replace('_', '-')} {options[theirs]!r} set the same thing"
            )
        out[theirs] = options[ours]
    return out


def free_port(host: str) -> int:
    """A port free on ``host`` now, for an engine that needs a fixed one (it may be taken
    before the engine binds it; the engine then fails to start and is restarted)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host if host not in ("0.0.0.0", "::") else "", 0))
        return int(sock.getsockname()[1])


class RequestLoad:
    """Load estimated from the adapter's own requests: every live request running, each
    holding the blocks of its prompt and output so far (shared prefixes counted per
    request). For engines whose scheduler statistics the adapter does not read."""

    def __init__(self, block_size: int = 1, total_blocks: int = 0) -> None:
        self.block_size = block_size
        self.total_blocks = total_blocks
        self._live: dict[str, tuple[int, int, bool]] = {}  # id -> (prompt, output, prefilled)

    def started(self, request_id: str, prompt_tokens: int) -> None:
        self._live[request_id] = (prompt_tokens, 0, False)

    def produced(self, request_id: str, tokens: int) -> None:
        if request_id in self._live:
            prompt, output, _ = self._live[request_id]
            self._live[request_id] = (prompt, output + tokens, True)

    def finished(self, request_id: str) -> None:
        self._live.pop(request_id, None)

    @property
    def live(self) -> list[str]:
        return list(self._live)

    def metrics(self) -> LoadMetrics:
        bs, total = max(self.block_size, 1), self.total_blocks
        active = sum(math.ceil((p + o) / bs) for p, o, _ in self._live.values())
        active = min(active, total) if total else active
        return LoadMetrics(
            active_blocks=active,
            total_blocks=total,
            num_waiting=0,
            num_running=len(self._live),
            prefill_tokens_queued=sum(p for p, _, done in self._live.values() if not done),
            kv_usage=active / total if total else 0.0,
        )


async def poll_death(cause: Callable[[], str | None], interval: float = DEATH_POLL) -> EngineDied:
    """Wait until ``cause()`` names a death (it is polled: engines report theirs from
    threads, signal handlers or other processes)."""
    while True:
        found = cause()
        if found is not None:
            return EngineDied(found)
        await asyncio.sleep(interval)


class ChildWatch:
    """The child processes this process gained while an engine started (its scheduler,
    detokenizer...), watched for an exit: for engines whose API says nothing when one of
    their own processes dies. Only direct children alive once the engine is up count,
    so helpers that came and went during start-up do not."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self._before = {p.pid for p in psutil.Process().children()}
        self._watched: list[tuple[psutil.Process, str]] = []

    def started(self) -> None:
        """The engine is up: watch the children it added."""
        for proc in psutil.Process().children():
            if proc.pid not in self._before:
                try:
                    self._watched.append((proc, proc.name()))
                except psutil.Error:  # gone already: noticed by gone() below
                    self._watched.append((proc, "?"))

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc, _ in self._watched]

    def gone(self) -> str | None:
        """Which watched process exited, if one did (a zombie counts: nobody reaped it yet)."""
        for proc, name in self._watched:
            try:
                alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                alive = False
            if not alive:
                return f"{self.engine} process {name} (pid {proc.pid}) exited"
        return None
