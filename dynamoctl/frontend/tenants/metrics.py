"""Per-key usage in ``/metrics``, labelled by the key's name, never the key (docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from dynamoctl.wire.frontend_metrics import CLASS_QUEUED


class KeyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "dynamoctl_frontend_key_requests_total",
            "Requests admitted, by API key name and priority class.",
            ["key", "class"], registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "dynamoctl_frontend_key_tokens_total",
            "Tokens used, by API key name: kind is prompt or completion.",
            ["key", "kind"], registry=registry,
        )  # fmt: skip
        self.limited = Counter(
            "dynamoctl_frontend_key_rate_limited_total",
            "Requests refused by a key's limits: limit is requests, tokens, concurrency "
            "or context.",
            ["key", "limit"], registry=registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            "dynamoctl_frontend_key_requests_in_flight",
            "Requests of each API key being served.",
            ["key"], registry=registry,
        )  # fmt: skip
        self.queued = Gauge(
            CLASS_QUEUED,
            "Requests waiting for a busy worker, by priority class.",
            ["class"], registry=registry,
        )  # fmt: skip
        self.reloads = Counter(
            "dynamoctl_frontend_key_file_reloads_total",
            "Readings of the API key file after start: result is ok or error (the keys "
            "before an error are kept).",
            ["result"], registry=registry,
        )  # fmt: skip
