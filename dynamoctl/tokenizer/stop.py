"""Stop strings on streamed text, with OpenAI semantics.

Generation stops at the first stop string in the output; the text before it is returned
and the stop string itself is not (``include_stop`` keeps it, like vLLM's
``include_stop_str_in_output``). Text arrives in chunks, and a stop string can be split
across them ("###" as "#" then "##"), so the tail of a chunk that could be the start of a
stop string is held back until the next chunk shows whether it is.

"First" means the stop string completed earliest (its last character comes first; on a
tie, the longer one). That is what a character-by-character stream would see, so the
result does not depend on how the engine happened to chunk its output.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class StopResult(NamedTuple):
    """What :meth:`StopStringMatcher.push` lets through."""

    text: str
    """Text to send to the client now."""
    stopped: bool
    """A stop string was found: send ``text``, then finish with ``finish_reason="stop"``."""


class StopStringMatcher:
    """Finds stop strings in one sequence's streamed text (see the module docstring).

    Without stop strings, text passes through unchanged and nothing is held back.
    """

    __slots__ = ("_held", "_include_stop", "_matched", "_stops")

    def __init__(self, stop: Iterable[str] = (), *, include_stop: bool = False) -> None:
        """``stop``: the request's stop strings (empty ones are ignored)."""
        self._stops = tuple(dict.fromkeys(s for s in stop if s))
        self._include_stop = include_stop
        self._held = ""
        self._matched: str | None = None

    @property
    def stopped(self) -> bool:
        """Whether a stop string was found (everything pushed after it is dropped)."""
        return self._matched is not None

    @property
    def matched(self) -> str | None:
        """The stop string found, if any (vLLM reports it as ``stop_reason``)."""
        return self._matched

    @property
    def held(self) -> str:
        """Text held back because it could be the start of a stop string."""
        return self._held

    def push(self, text: str) -> StopResult:
        """Add the next chunk of text; return what can be sent and whether to stop."""
        if self._matched is not None:
            return StopResult("", True)
        if not self._stops:
            return StopResult(text, False)
        buf = self._held + text
        hit = self._first_stop(buf)
        if hit is not None:
            start, stop = hit
            self._matched, self._held = stop, ""
            return StopResult(buf[: start + len(stop) if self._include_stop else start], True)
        keep = self._partial_stop_len(buf)
        self._held = buf[len(buf) - keep :]
        return StopResult(buf[: len(buf) - keep], False)

    def flush(self, text: str = "") -> str:
        """End of the stream: push ``text`` (the detokenizer's last text), then release what
        was held back, since no stop string can complete any more."""
        out, stopped = self.push(text)
        if stopped:
            return out
        out, self._held = out + self._held, ""
        return out

    def _first_stop(self, buf: str) -> tuple[int, str] | None:
        """(start, stop string) of the stop that ends first in ``buf``; ties: longest."""
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            start = buf.find(stop)  # the first occurrence of a string is also its first end
            if start >= 0:
                key = (start + len(stop), start, stop)
                if best is None or key < best:
                    best = key
        return None if best is None else (best[1], best[2])

    def _partial_stop_len(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that a stop string starts with.

        Held back: text before it can never be part of a stop string (a stop string
        starting earlier would make a longer such suffix), so it is safe to send.
        """
        longest = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), longest, -1):
                if buf.endswith(stop[:k]):
                    longest = k
                    break
        return longest
