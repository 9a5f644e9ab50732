"""Load of a vLLM engine, as :class:`LoadMetrics`: vLLM's scheduler statistics (running,
waiting, KV usage) combined with what the adapter knows of its own requests.

vLLM reports scheduler statistics with the outputs of engine steps, so the last report
of a busy period can stay "busy" after the engine went idle. Whether any request is
unfinished is asked of vLLM itself at each reading (``get_num_unfinished_requests``): with
none, the engine is idle whatever it reported last.
"""

from __future__ import annotations

from dynamoctl.wire.engine import LoadMetrics


class LoadTracker:
    """Load from scheduler reports plus the adapter's own live requests."""

    def __init__(self) -> None:
        self.total_blocks = 0
        """KV capacity in blocks (set once the engine started)."""
        self._running = 0
        self._usage = 0.0
        self._unprefilled: dict[str, int] = {}  # live request -> prompt tokens, 0 once prefilled

    def on_scheduler_stats(self, running: int, kv_usage: float) -> None:
        """A report from vLLM's scheduler (``SchedulerStats``); its waiting count is not
        needed: whatever vLLM has unfinished and not running is waiting."""
        self._running, self._usage = running, kv_usage

    def started(self, request_id: str, prompt_tokens: int) -> None:
        self._unprefilled[request_id] = prompt_tokens

    def prefilled(self, request_id: str) -> None:
        """The request produced its first output: its prompt is computed."""
        if request_id in self._unprefilled:
            self._unprefilled[request_id] = 0

    def finished(self, request_id: str) -> None:
        self._unprefilled.pop(request_id, None)

    @property
    def live(self) -> list[str]:
        """Requests the adapter submitted that have not finished."""
        return list(self._unprefilled)

    def metrics(self, unfinished: int) -> LoadMetrics:
        """Load now, given how many requests vLLM has not finished."""
        total = self.total_blocks
        if unfinished <= 0:
            return LoadMetrics(
                active_blocks=0,
                total_blocks=total,
                num_waiting=0,
                num_running=0,
                prefill_tokens_queued=0,
                kv_usage=0.0,
            )
        usage = min(max(self._usage, 0.0), 1.0)
        running = min(self._running, unfinished)  # the rest is queued (or not yet reported)
        return LoadMetrics(
            active_blocks=round(usage * total),
            total_blocks=total,
            num_waiting=unfinished - running,
            num_running=running,
            prefill_tokens_queued=sum(self._unprefilled.values()),
            kv_usage=usage,
        )
