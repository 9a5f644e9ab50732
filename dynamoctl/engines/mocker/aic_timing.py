"""The mocker's second timing source: AI Configurator's step latencies (``perf_model: aic``).

Besides the polynomial model (:mod:`.timing`), a mocker can take its step times from AI
Configurator's per-operation GPU data for a model, system, engine and parallelism
(docs/mocker.md, "Timing from AI Configurator"), so a simulation runs at the speed the
configurator predicts (``dynamoctl configure --verify``). At start the engine tabulates
prefill time against tokens and decode time against batch size x context length (a few
hundred calls to AI Configurator's compiled engine after a ~3 s compile); a step then
costs two bisections and an interpolation, never a call into AI Configurator.

A step of ``P`` prompt tokens and ``D`` decodes at mean context ``c`` lasts

* ``decode(D, c)`` without prompt tokens;
* ``prefill(P)`` without decodes;
* ``prefill(P + D) + decode(D, c) - decode(D, 1)`` mixed: one forward pass whose matrix
  multiplications cover all ``P + D`` tokens, plus the decodes' attention over their
  contexts (within 1% of AI Configurator's own mixed-step estimate for Llama-3.1-70B).

``c`` is derived from the step's KV usage: held tokens (``kv_usage`` x capacity) less the
step's prompt tokens, over ``D``. Several prompts in one step are costed as one sequence
of ``P`` tokens (their attention is overestimated a little).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dynamoctl.engines.mocker.config import MockerConfig


class StepTiming(Protocol):
    """How long one engine step takes, in milliseconds (:class:`.timing.TimingModel` and
    :class:`AicTiming`)."""

    def step_ms(self, prefill_tokens: int, num_decode: int, kv_usage: float) -> float: ...


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), extended linearly past both ends."""
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


class AicTiming:
    """Step times interpolated in tables of AI Configurator's latencies (see the module
    docstring)."""

    def __init__(
        self,
        prefill_tokens: Sequence[int],
        prefill_ms: Sequence[float],
        batches: Sequence[int],
        contexts: Sequence[int],
        decode_ms: Sequence[Sequence[float]],
        capacity_tokens: int,
    ) -> None:
        if len(prefill_tokens) < 2 or len(batches) < 2 or len(contexts) < 2:
            raise ValueError("an AI Configurator table needs at least two points per axis")
        self.prefill_tokens = [float(x) for x in prefill_tokens]
        self.prefill_table = list(prefill_ms)
        self.batches = [float(x) for x in batches]
        self.contexts = [float(x) for x in contexts]
        self.decode_table = [list(row) for row in decode_ms]
        """``decode_table[i][j]``: ``batches[i]`` requests at ``contexts[j]`` tokens."""
        self.capacity_tokens = capacity_tokens

    @classmethod
    def build(cls, config: MockerConfig) -> AicTiming:
        """Tabulate ``config``'s model over the mocker's own limits (batch up to
        ``max_num_seqs``, prompt tokens per step up to ``max_num_batched_tokens``,
        contexts up to ``context_length``)."""
        from dynamoctl.configure import aic
        from dynamoctl.configure.models import ConfigureError, Parallel

        if config.aic_model is None:
            raise ConfigureError("perf_model aic needs aic_model (a model id or directory)")
        parallel = Parallel(
            tp=config.aic_tp_size, pp=config.aic_pp_size, dp=config.aic_dp_size,
            moe_tp=config.aic_moe_tp_size, moe_ep=config.aic_moe_ep_size,
        )  # fmt: skip
        steps = aic.step_latency(
            config.aic_model, config.aic_system, config.aic_engine,
            config.aic_engine_version, parallel,
        )  # fmt: skip
        tokens = aic.geometric(1, config.max_num_batched_tokens + config.max_num_seqs)
        batches = aic.geometric(1, max(2, config.max_num_seqs))
        contexts = aic.geometric(1, max(2, config.context_length), 2.0)
        return cls(
            tokens,
            [steps.prefill_ms(n) for n in tokens],
            batches,
            contexts,
            [[steps.decode_ms(b, c) for c in contexts] for b in batches],
            config.num_gpu_blocks * config.block_size,  # what kv_usage is a fraction of
        )

    def prefill_ms(self, tokens: int) -> float:
        return max(0.0, _interp(self.prefill_tokens, self.prefill_table, tokens))

    def decode_ms(self, batch: int, context: float) -> float:
        """Bilinear in (batch, context)."""
        bs, table = self.batches, self.decode_table
        i = min(max(bisect.bisect_left(bs, batch), 1), len(bs) - 1)
        lo = _interp(self.contexts, table[i - 1], context)
        hi = _interp(self.contexts, table[i], context)
        return max(0.0, lo + (hi - lo) * (batch - bs[i - 1]) / (bs[i] - bs[i - 1]))

    def step_ms(self, prefill_tokens: int, num_decode: int, kv_usage: float) -> float:
        if num_decode == 0:
            return self.prefill_ms(prefill_tokens) if prefill_tokens > 0 else 0.0
        held = kv_usage * self.capacity_tokens - prefill_tokens
        context = max(1.0, held / num_decode)
        decode = self.decode_ms(num_decode, context)
        if prefill_tokens <= 0:
            return decode
        attention = max(0.0, decode - self.decode_ms(num_decode, 1.0))
        return self.prefill_ms(prefill_tokens + num_decode) + attention


def timing_for(config: MockerConfig) -> StepTiming:
    """The timing source ``config`` names."""
    if config.perf_model == "aic":
        return AicTiming.build(config)
    from dynamoctl.engines.mocker.timing import TimingModel

    return TimingModel()
