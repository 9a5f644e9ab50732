"""What the mocker "samples" (docs/mocker.md, "Sampling and end of sequence").

Output token ``i`` of a request is :func:`mock_token` of its seed and ``i``: a pure function
of both, so a request yields the same tokens however it is scheduled or preempted, and a
seeded request is reproducible. Like a model, a request ends by itself: its end-of-sequence
token comes after a length drawn (from the same seed) from the configured distribution
(:class:`~dynamoctl.engines.mocker.config.MockerConfig` ``eos_distribution``); ``max_tokens``
still bounds it, and ``ignore_eos`` turns it off. The client's ``user_stop_token_ids`` end
a request when a drawn token is one of them, and ``min_tokens`` holds back both until
enough tokens were produced (a stop token drawn too early is redrawn, as a model's masked
logits would). Log-probabilities are plausible, not a model's: the sampled token is the
most likely one, with a probability drawn from the seed, and the alternatives share the
rest in decreasing halves. A prompt token's log-probability (``prompt_logprobs``) is drawn
from it and the token before it, so equal prompts score equally: usually the most likely
token, sometimes ranked a few places down, below alternatives that take what it leaves.

Temperature, top-p/top-k/min-p, penalties and logit bias are accepted and change nothing:
the tokens carry no meaning to sample from.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Sequence
from typing import Final, Literal

import xxhash

from dynamoctl.engines.api import GenerateRequest
from dynamoctl.wire.engine import TokenLogprobs
from dynamoctl.wire.ids import packed, to_bytes

_U64: Final = (1 << 64) - 1
_pack_seed_index: Final = struct.Struct("<QQ").pack
_EOS_SALT: Final = 0x5EED_E05
_LOGPROB_SALT: Final = 0x1060_9A0B
_PROMPT_SALT: Final = 0x9807_4C0B

EosDistribution = Literal["geometric", "uniform", "fixed", "none"]
"""How a request's output length (end-of-sequence included) is drawn, with mean
``eos_mean_tokens``: ``geometric`` (after the first token, each ends the sequence with
the same probability, as a model's EOS roughly does), ``uniform`` (2 .. 2*mean-2),
``fixed`` (always the mean), ``none`` (never: only ``max_tokens`` ends a request)."""


def mock_token(seed: int, index: int, vocab_size: int) -> int:
    """Output token ``index`` of a request seeded ``seed``: a pure function of both, so a
    request yields the same tokens however it is scheduled or preempted."""
    return xxhash.xxh3_64_intdigest(_pack_seed_index(seed & _U64, index)) % vocab_size


def _unit(seed: int, index: int) -> float:
    """A number in (0, 1] drawn from ``seed`` and ``index``."""
    return (xxhash.xxh3_64_intdigest(_pack_seed_index(seed & _U64, index)) + 1) / 2**64


def request_seed(request: GenerateRequest) -> int:
    """The request's seed; else, greedy (temperature 0), one derived from its prompt, as a
    model's greedy answer is a function of its prompt; else one derived from its id."""
    if request.seed is not None:
        return request.seed
    if request.temperature == 0:
        return xxhash.xxh3_64_intdigest(to_bytes(packed(request.token_ids)))
    return xxhash.xxh3_64_intdigest(request.request_id.encode())


def output_length(seed: int, distribution: EosDistribution, mean: float) -> int | None:
    """Tokens a request seeded ``seed`` generates before it ends itself, its end-of-sequence
    token included; None: it never does. At least one token precedes the end of sequence
    (when the mean allows): an empty answer is rare for a model, and clients such as
    aiperf count one as a failed request."""
    if distribution == "none":
        return None
    if distribution == "fixed":
        return max(1, round(mean))
    if mean < 2:
        return 1 if mean < 1.5 else 2
    u = _unit(seed ^ _EOS_SALT, 0)
    if distribution == "uniform":  # 2 .. 2 * mean - 2
        return 2 + int(u * (2 * mean - 3) - 1e-12)
    # 1 + geometric on {1, 2, ...} of mean ``mean - 1``: inverse transform of u in (0, 1].
    rest = mean - 1
    return 2 + int(math.log(u) / math.log1p(-1 / rest)) if rest > 1 else 2


class MockSampler:
    """One request's token source and stopping rule (see the module docstring)."""

    __slots__ = (
        "eos_at", "eos_id", "logprobs", "min_tokens", "script", "seed", "stops", "vocab_size",
    )  # fmt: skip

    def __init__(
        self,
        request: GenerateRequest,
        vocab_size: int,
        distribution: EosDistribution,
        mean: float,
    ) -> None:
        self.seed = request_seed(request)
        self.vocab_size = vocab_size
        self.stops = frozenset(request.user_stop_token_ids)
        self.min_tokens = request.min_tokens
        self.logprobs = request.logprobs
        eos = None if request.ignore_eos or not request.stop_token_ids else request.stop_token_ids
        length = output_length(self.seed, distribution, mean) if eos else None
        self.eos_id = min(eos) if eos else -1
        self.eos_at = -1 if length is None else max(length, self.min_tokens + 1) - 1
        """Output index of the end-of-sequence token; -1: none."""
        self.script: list[int] | None = None
        """Output tokens decided up front (a structured answer, :mod:`.output`): they come
        first, ending with end-of-sequence when the answer is complete; sampled tokens
        follow (their own end drawn from where the script ends)."""

    def token(self, index: int) -> tuple[int, bool]:
        """Output token ``index`` and whether it ends the request (``stop``)."""
        if self.script is not None:
            if index < len(self.script):
                token = self.script[index]
                return token, token == self.eos_id
            index -= len(self.script)
        if index == self.eos_at:
            return self.eos_id, True
        token = mock_token(self.seed, index, self.vocab_size)
        if token in self.stops:
            if index >= self.min_tokens:
                return token, True
            for salt in range(1, len(self.stops) + 2):  # masked: draw again
                token = mock_token(self.seed ^ salt, index, self.vocab_size)
                if token not in self.stops:
                    break
        return token, False

    def logprobs_of(self, token: int, index: int) -> TokenLogprobs:
        """Plausible log-probabilities of output token ``index`` (``token``) and the
        request's number of alternatives."""
        p = 0.35 + 0.6 * _unit(self.seed ^ _LOGPROB_SALT, index)
        top = self.logprobs or 0
        ids: list[int] = [token] if top else []
        probs: list[float] = [p] if top else []
        rest, j = 1 - p, 0
        while len(ids) < top and j < 4 * top:
            alt = mock_token(self.seed ^ _LOGPROB_SALT, index * 64 + j, self.vocab_size)
            j += 1
            if alt not in ids:
                rest /= 2
                ids.append(alt)
                probs.append(min(rest, probs[-1]))
        return TokenLogprobs(math.log(p), ids, [math.log(q) for q in probs])


def prompt_logprobs(
    token_ids: Sequence[int], top: int, vocab_size: int
) -> list[TokenLogprobs | None]:
    """Plausible log-probabilities of each prompt token after the one before it (the first
    has none), with ``top`` alternatives ranked 1..top: rank ``k`` has probability
    ``head`` for k = 1 and ``(1 - head) / 2**(k-1)`` after, the token sits at its rank."""
    entries: list[TokenLogprobs | None] = [None] if token_ids else []
    for prev, token in itertools.pairwise(token_ids):
        seed = _PROMPT_SALT ^ (prev << 20)
        head = 0.35 + 0.6 * _unit(seed, token)
        u = _unit(seed ^ _EOS_SALT, token)
        rank = 1 if u > 0.4 else 2 + int(u * 10)
        ids, probs = [], []
        for k in range(1, top + 1):
            alt = mock_token(seed, token * 64 + k, vocab_size)
            ids.append(token if k == rank else alt if alt != token else (alt + 1) % vocab_size)
            probs.append(math.log(head if k == 1 else (1 - head) / 2 ** (k - 1)))
        p = head if rank == 1 else (1 - head) / 2 ** (rank - 1)
        entries.append(TokenLogprobs(math.log(p), ids, probs, rank))
    return entries
