"""The load step of the planner's end-to-end tests: one light client throughout, twelve
heavy ones until :meth:`StepLoad.drop`; 1000-word prompts with no shared prefix (~30 ms
of simulated prefill each alone), bounded in count and time."""

from __future__ import annotations

import random
import threading
from types import TracebackType

from tests.supervisor.conftest import completions_until

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]


def prompt() -> str:
    return " ".join(random.choice(WORDS) for _ in range(1000))


class StepLoad:
    """``with StepLoad(base_url) as load``: every client runs until the block ends (the
    heavy ones until ``drop()``); ``errors`` and ``done`` are what they saw."""

    def __init__(self, base_url: str, heavy: int = 12) -> None:
        self.errors: list[str] = []
        self.done: list[int] = []
        self._stop_heavy, self._stop_light = threading.Event(), threading.Event()
        self._heavy = [self._client(base_url, self._stop_heavy) for _ in range(heavy)]
        self._light = [self._client(base_url, self._stop_light)]

    def _client(self, base_url: str, stop: threading.Event) -> threading.Thread:
        args = (base_url, stop, self.errors, self.done)
        kwargs = {"most": 100_000, "timeout": 60.0, "prompt": prompt}
        return threading.Thread(target=completions_until, args=args, kwargs=kwargs)

    def __enter__(self) -> StepLoad:
        for thread in [*self._light, *self._heavy]:
            thread.start()
        return self

    def drop(self) -> None:
        """Stop the heavy clients (waiting for their last requests); the light one goes on."""
        self._stop_heavy.set()
        for thread in self._heavy:
            thread.join(90)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop_heavy.set()
        self._stop_light.set()
        for thread in [*self._heavy, *self._light]:
            thread.join(90)
