"""A key's token buckets on a clock the test moves: OpenAI's headers, 429s, reloads."""

from __future__ import annotations

from dynamoctl.frontend.tenants.limits import Bucket, KeyLimiter, _duration, context_exceeded
from dynamoctl.settings.keyfile import KeyEntry, Limits


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def entry(**limits: int) -> KeyEntry:
    return KeyEntry(name="alice", key="sk-alice", limits=Limits(**limits))


def test_requests_per_minute_refuse_then_refill_evenly() -> None:
    clock = Clock()
    limiter = KeyLimiter(entry(requests_per_minute=3), clock=clock)
    for _ in range(3):
        assert limiter.admit() is None
        limiter.release()
    refused = limiter.admit()
    assert refused is not None
    limit, error = refused
    assert (limit, error.status, error.type, error.code) == (
        "requests", 429, "requests", "rate_limit_exceeded"
    )  # fmt: skip
    assert error.retry_after == 20.0  # one request back every 60/3 s
    assert error.headers["x-ratelimit-limit-requests"] == "3"
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert error.headers["x-ratelimit-reset-requests"] == "1m0s"
    clock.now += 20
    assert limiter.admit() is None


def test_tokens_are_counted_as_used_and_refuse_while_overdrawn() -> None:
    clock = Clock()
    limiter = KeyLimiter(entry(tokens_per_minute=600), clock=clock)
    assert limiter.admit() is None
    limiter.spend(900)  # the request in flight overran the bucket
    limiter.release()
    refused = limiter.admit()
    assert refused is not None and refused[0] == "tokens"
    assert refused[1].retry_after is not None and 30 <= refused[1].retry_after <= 31
    clock.now += 31  # 310 tokens back: above zero again
    assert limiter.admit() is None
    headers = dict(limiter.headers())
    assert headers[b"x-ratelimit-remaining-tokens"] == b"10"
    assert headers[b"x-ratelimit-reset-tokens"] == b"59s"


def test_concurrency_and_context() -> None:
    limiter = KeyLimiter(entry(concurrent_requests=1, max_context=100))
    assert limiter.admit() is None
    refused = limiter.admit()
    assert refused is not None and refused[0] == "concurrency"
    limiter.release()
    assert limiter.admit() is None
    assert context_exceeded(limiter.entry, 60, 40) is None
    error = context_exceeded(limiter.entry, 60, 41)
    assert error is not None and (error.status, error.code, error.param) == (
        400, "context_length_exceeded", "max_tokens"
    )  # fmt: skip
    error = context_exceeded(limiter.entry, 120, 1)
    assert error is not None and error.param == "messages"


def test_a_reload_keeps_what_was_used() -> None:
    clock = Clock()
    bucket = Bucket(100, clock=clock)
    bucket.level -= 30
    bucket.resize(50)
    assert bucket.refill() == 20
    assert bucket.rate == 50 / 60


def test_durations_in_openai_form() -> None:
    assert [_duration(s) for s in (0.02, 1.5, 6.0, 360.0, 75.25)] == [
        "20ms", "1.5s", "6s", "6m0s", "1m15.25s"
    ]  # fmt: skip
