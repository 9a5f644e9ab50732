"""What the mocker's scheduler (:mod:`~dynamoctl.engines.mocker.scheduler`) keeps of a
request (:class:`SeqState`, in one :class:`Status` at a time) and what one step computes
(:class:`StepPlan`) and yields (:class:`StepOutput`)."""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field
from typing import NamedTuple

from dynamoctl.engines.api import FinishReason, GenerateRequest
from dynamoctl.engines.mocker.sampling import MockSampler


class Status(enum.Enum):
    WAITING = "waiting"
    """Queued; holds no blocks (new, or preempted)."""
    LOADING = "loading"
    """Admitted with lower-tier blocks to load; holds blocks, computes nothing yet."""
    RUNNING = "running"
    """Scheduled every step until it finishes or is preempted; holds blocks."""
    FINISHED = "finished"
    """Done, aborted or removed; holds nothing."""


class SeqState:
    """A request inside the scheduler."""

    __slots__ = (
        "adapter",
        "arrival",
        "blocks",
        "cached_tokens",
        "hashes",
        "max_tokens",
        "num_computed",
        "num_stored",
        "pin",
        "priority",
        "prompt_len",
        "ready_at",
        "remote_kv",
        "request_id",
        "sampler",
        "status",
        "tokens",
    )

    def __init__(
        self, request: GenerateRequest, hashes: list[int], pin: bool, remote_kv: bool,
        sampler: MockSampler,
    ) -> None:  # fmt: skip
        self.request_id = request.request_id
        self.adapter = request.adapter
        """The LoRA adapter it runs under (its hash chain starts from the adapter's name)."""
        self.tokens = array("I", request.token_ids)  # a packed prompt: one buffer copied
        """Prompt then output; the last one is not computed yet."""
        self.prompt_len = len(request.token_ids)
        self.max_tokens = request.max_tokens
        self.sampler = sampler
        """Its tokens and when it ends itself (:mod:`~dynamoctl.engines.mocker.sampling`)."""
        self.hashes = hashes
        """Sequence hash of every full block of ``tokens`` (empty without caching)."""
        self.blocks: list[int] = []
        self.num_computed = 0
        """Tokens whose KV is in ``blocks``."""
        self.num_stored = 0
        """Leading blocks already offered to the prefix cache."""
        self.cached_tokens = -1
        """Prefix-cache hit at first admission, -1 before it."""
        self.status = Status.WAITING
        self.ready_at = 0.0
        """LOADING: simulated time its lower-tier blocks are in GPU memory."""
        self.pin = pin
        """Keep the blocks held when finished (a prefill for a remote decode)."""
        self.remote_kv = remote_kv
        """The prompt's KV was pulled: admit it computed (until a preemption)."""
        self.priority = request.priority
        self.arrival = 0
        """Its place in arrival order (:mod:`.priority`)."""

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass(slots=True)
class StepPlan:
    """What one step computes."""

    scheduled: list[tuple[SeqState, int]] = field(default_factory=list)
    """Requests and how many tokens each computes."""
    prefill_tokens: int = 0
    """Tokens computed that are not decodes (prompt chunks, recomputation)."""
    num_decode: int = 0
    """Requests extending their output by one token."""
    kv_usage: float = 0.0
    """Held blocks / total blocks once the step's blocks are allocated."""
    num_loading: int = 0
    """Requests admitted loading lower-tier blocks (they compute in a later step)."""
    num_preempted: int = 0


class StepOutput(NamedTuple):
    seq: SeqState
    token: int
    finish: FinishReason | None
