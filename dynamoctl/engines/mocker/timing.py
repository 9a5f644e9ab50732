"""How long one engine step takes: Dynamo's published polynomial model, in milliseconds.

* prefill: ``t = 4.209989e-7·N² + 1.518344e-2·N + 16.50142`` with N the uncached tokens
  computed in the step, summed over the step's requests (one batched forward pass, as
  Dynamo's later mocker does; its first version summed the polynomial per request, which
  charges the 16.5 ms intercept once per request in a batch);
* decode: ``t = max(1, -25.74·u² + 54.01·u + 5.74)`` with ``u`` = KV tokens held by
  running requests / KV capacity in tokens (= active blocks / total blocks, as Dynamo
  counts it).

A step with both kinds of work lasts ``prefill + decode``: Dynamo's mocker runs its
prefill phase and then its decode phase in every iteration and adds their durations, and
a mixed batch on a GPU does both computations. Decode time is charged only when some
request in the step extends its output (it has already emitted a token); the token that
completes a prefill comes out of the prefill pass, so a lone request's TTFT is exactly
``prefill(N)`` (the model's TTFT curve) and each later token exactly ``decode(u)`` (its
ITL curve). The speedup ratio is not applied here: it is the clock's business.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimingModel:
    """Step duration in milliseconds; coefficients are (constant, linear, quadratic)."""

    prefill: tuple[float, float, float] = (16.50142, 1.518344e-2, 4.209989e-7)
    """Prefill time in ms as a polynomial of the step's uncached tokens."""
    decode: tuple[float, float, float] = (5.74, 54.01, -25.74)
    """Decode time in ms as a polynomial of KV usage ``u`` in [0, 1]."""
    decode_floor_ms: float = 1.0
    """Lower bound of a decode step (tokens never share a timestamp)."""

    def prefill_ms(self, new_tokens: int) -> float:
        """Time to compute ``new_tokens`` uncached prompt tokens in one step (0 for none)."""
        if new_tokens <= 0:
            return 0.0
        c, b, a = self.prefill
        return a * new_tokens * new_tokens + b * new_tokens + c

    def decode_ms(self, kv_usage: float) -> float:
        """Time of one decode step at KV usage ``kv_usage``."""
        c, b, a = self.decode
        return max(self.decode_floor_ms, a * kv_usage * kv_usage + b * kv_usage + c)

    def step_ms(self, prefill_tokens: int, num_decode: int, kv_usage: float) -> float:
        """A step computing ``prefill_tokens`` uncached tokens and ``num_decode`` decode
        tokens while requests hold ``kv_usage`` of the KV cache."""
        t = self.prefill_ms(prefill_tokens)
        if num_decode:
            t += self.decode_ms(kv_usage)
        return t
