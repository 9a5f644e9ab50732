"""Pieces shared by the real-engine adapters: engine argument aliases, free ports, and a
load estimate for engines whose own scheduler statistics we do not read."""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping
from typing import Any

from dynamoctl.wire.engine import LoadMetrics


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
