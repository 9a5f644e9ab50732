"""One key's limits at run time: token buckets for requests and tokens per minute, the
requests in flight, and the ``x-ratelimit-*`` headers and 429s OpenAI answers with
(docs/security.md, "Limits").

A bucket holds up to its limit, refills evenly over a minute, and starts full. A request
takes one from the requests bucket when it starts; tokens are taken as they are used
(the prompt when a choice starts, the completion when it ends), so the tokens bucket may
go below zero and a key that overran waits until it is above zero again. Over any window
of T seconds a key is therefore served at most ``limit * T / 60`` plus one bucket plus
what its requests in flight use beyond it: the bound the docs state.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from dynamoctl.frontend.errors import OpenAIError
from dynamoctl.settings.keyfile import KeyEntry

SECONDS_PER_MINUTE = 60.0


@dataclass
class Bucket:
    """A token bucket of ``limit`` refilled at ``limit`` per minute."""

    limit: int
    level: float = -1.0
    stamp: float = 0.0
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if self.level < 0:
            self.level = float(self.limit)
        self.stamp = self.clock()

    @property
    def rate(self) -> float:
        return self.limit / SECONDS_PER_MINUTE

    def refill(self) -> float:
        now = self.clock()
        self.level = min(float(self.limit), self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        return self.level

    def resize(self, limit: int) -> None:
        """A new limit from a reloaded key file: what was used stays used."""
        used = self.limit - self.refill()
        self.limit = limit
        self.level = limit - used

    def seconds_until(self, level: float) -> float:
        return max(0.0, (level - self.refill()) / self.rate)

    def remaining(self) -> float:
        """What the key may still use now (``x-ratelimit-remaining-*``)."""
        return self.refill()


@dataclass
class GrantedBucket(Bucket):
    """One frontend process's part of a key's bucket shared by the deployment
    (:mod:`dynamoctl.frontend.tenants.shared`): filled by grants taken from the shared
    bucket, never by time."""

    empty_until: float = 0.0
    """Monotonic time until which the shared bucket is known to be empty: refusals until
    then cost no round trip to discovery."""
    shared_left: float = 0.0
    """What the shared bucket held after this process's last grant (at ``stamp``)."""

    def refill(self) -> float:
        return self.level

    def resize(self, limit: int) -> None:
        self.limit = limit  # what was granted stays granted; the shared bucket resizes

    def seconds_until(self, level: float) -> float:
        return max(self.empty_until - time.monotonic(), (level - self.level) / self.rate, 0.0)

    def remaining(self) -> float:
        """This process's part plus the shared bucket as last read, refilled since."""
        shared = self.shared_left + (self.clock() - self.stamp) * self.rate
        return min(float(self.limit), max(0.0, self.level) + max(0.0, shared))


@dataclass
class KeyLimiter:
    """The run-time state of one key, kept across reloads of the key file by name."""

    entry: KeyEntry
    clock: Callable[[], float] = time.monotonic
    requests: Bucket | None = None
    tokens: Bucket | None = None
    in_flight: int = 0
    generation: int = 0
    """Raised when the key is revoked or its secret replaced: a ticket admitted under an
    earlier generation is no longer valid (its queued request is refused)."""
    granted: bool = False
    """The buckets are this process's grants of the deployment's shared ones."""
    shared: bool = False
    """Granted and with a limit the deployment shares (rates or concurrency): admitting
    it may ask discovery; a key without one never does."""

    def __post_init__(self) -> None:
        self.update(self.entry)

    def update(self, entry: KeyEntry) -> None:
        self.entry = entry
        limits = entry.limits
        self.requests = _rebucket(
            self.requests, limits.requests_per_minute, self.clock, self.granted
        )
        self.tokens = _rebucket(self.tokens, limits.tokens_per_minute, self.clock, self.granted)
        rates = self.requests is not None or self.tokens is not None
        self.shared = self.granted and (rates or limits.concurrent_requests is not None)

    def admit(self) -> tuple[str, OpenAIError] | None:
        """Take one request if every limit allows it; else the limit that refused it
        (``concurrency``, ``requests`` or ``tokens``) and the 429 to answer."""
        refused = self.refusal()
        if refused is None:
            self.take()
        return refused

    def too_many(self) -> tuple[str, OpenAIError]:
        """The 429 of a key at its ``concurrent_requests``."""
        return "concurrency", self._refused(
            "requests",
            f"Too many concurrent requests for key '{self.entry.name}': "
            f"limit {self.entry.limits.concurrent_requests}; wait for one to finish.",
            1.0,
        )

    def refusal(self) -> tuple[str, OpenAIError] | None:
        """What :meth:`admit` would refuse, taking nothing."""
        limits = self.entry.limits
        if limits.concurrent_requests is not None and self.in_flight >= limits.concurrent_requests:
            return self.too_many()
        if self.requests is not None and self.requests.refill() < 1:
            wait = self.requests.seconds_until(1)
            return "requests", self._refused(
                "requests",
                f"Rate limit reached for key '{self.entry.name}' on requests per min (RPM): "
                f"Limit {self.requests.limit}. Please try again in {_duration(wait)}.",
                wait,
            )
        if self.tokens is not None and self.tokens.refill() <= 0:
            wait = self.tokens.seconds_until(1)
            return "tokens", self._refused(
                "tokens",
                f"Rate limit reached for key '{self.entry.name}' on tokens per min (TPM): "
                f"Limit {self.tokens.limit}, Used {self.tokens.limit - int(self.tokens.level)}. "
                f"Please try again in {_duration(wait)}.",
                wait,
            )
        return None

    def take(self) -> None:
        """Count one request admitted."""
        if self.requests is not None:
            self.requests.level -= 1
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1

    def spend(self, tokens: int) -> None:
        if self.tokens is not None:
            self.tokens.refill()
            self.tokens.level -= tokens

    def headers(self) -> list[tuple[bytes, bytes]]:
        """OpenAI's ``x-ratelimit-*`` headers for the limits this key has."""
        found: list[tuple[bytes, bytes]] = []
        for kind, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            if bucket is None:
                continue
            level = bucket.remaining()
            reset = (bucket.limit - level) / bucket.rate
            found += [
                (f"x-ratelimit-limit-{kind}".encode(), str(bucket.limit).encode()),
                (f"x-ratelimit-remaining-{kind}".encode(), str(max(0, int(level))).encode()),
                (f"x-ratelimit-reset-{kind}".encode(), _duration(reset).encode()),
            ]
        return found

    def _refused(self, kind: str, message: str, wait: float) -> OpenAIError:
        headers = {name.decode(): value.decode() for name, value in self.headers()}
        # Retry-After is whole seconds; OpenAI's clients read this first, so a client
        # comes back when the bucket lets it in, not up to a second later.
        headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
        return OpenAIError(
            429, message, type=kind, code="rate_limit_exceeded", retry_after=wait, headers=headers
        )


def context_exceeded(entry: KeyEntry, prompt: int, max_tokens: int) -> OpenAIError | None:
    """The 400 for a request longer than the key's ``max_context``; None if it fits."""
    limit = entry.limits.max_context
    if limit is None or prompt + max_tokens <= limit:
        return None
    return OpenAIError(
        400,
        f"This key's maximum context length is {limit} tokens. However, you requested "
        f"{prompt + max_tokens} tokens ({prompt} in the prompt, {max_tokens} for the "
        "completion). Please reduce the prompt or max_tokens.",
        param="max_tokens" if prompt < limit else "messages",
        code="context_length_exceeded",
    )


def _rebucket(
    bucket: Bucket | None, limit: int | None, clock: Callable[[], float], granted: bool
) -> Bucket | None:
    if limit is None:
        return None
    if bucket is None:
        return (
            GrantedBucket(limit, level=0.0, clock=clock) if granted else Bucket(limit, clock=clock)
        )
    bucket.resize(limit)
    return bucket


def _duration(seconds: float) -> str:
    """OpenAI's (Go's) duration form: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(round(seconds, 3), 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text
