"""The frontend's Prometheus metrics (documented in docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dynamoctl.wire import frontend_metrics as names

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0,
)  # fmt: skip
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0)
_DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class FrontendMetrics:
    """One set per frontend process, in its own registry (tests run several at once)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["model"]
        r = self.registry
        self.ttft = Histogram(
            names.TIME_TO_FIRST_TOKEN,
            "Request arrival to first token.",
            labels, buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            names.INTER_TOKEN_LATENCY,
            "Time between consecutive tokens of a request.",
            labels, buckets=_ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            "dynamoctl_frontend_request_duration_seconds",
            "Request arrival to last token.",
            labels, buckets=_DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.requests = Counter(
            names.REQUESTS, "Requests by outcome.",
            ["model", "endpoint", "status"], registry=r,
        )  # fmt: skip
        self.received = Counter(
            names.REQUESTS_RECEIVED,
            "Requests accepted for generation, counted on arrival (requests_total counts "
            "them when they end): the arrival rate the planner forecasts.",
            labels, registry=r,
        )  # fmt: skip
        self.input_tokens = Counter(names.INPUT_TOKENS, "Prompt tokens.", labels, registry=r)
        self.cached_tokens = Counter(
            "dynamoctl_frontend_cached_tokens", "Prompt tokens served from prefix caches.",
            labels, registry=r,
        )  # fmt: skip
        self.output_tokens = Counter(names.OUTPUT_TOKENS, "Generated tokens.", labels, registry=r)
        self.inflight = Gauge(
            "dynamoctl_frontend_inflight_requests", "Requests being served.", labels, registry=r
        )
        self.rejections = Counter(
            "dynamoctl_frontend_rejections", "Requests refused with 503 (overload).",
            labels, registry=r,
        )  # fmt: skip
        self.cancellations = Counter(
            "dynamoctl_frontend_cancellations", "Requests cancelled by client disconnect.",
            labels, registry=r,
        )  # fmt: skip
        self.remote_prefills = Counter(
            "dynamoctl_frontend_remote_prefills",
            "Requests prefilled on a prefill worker, then decoded with its KV hand-off.",
            labels, registry=r,
        )  # fmt: skip
        self.local_prefills = Counter(
            "dynamoctl_frontend_local_prefills",
            "Requests of a disaggregated model prefilled on their decode worker by choice "
            "(reason: short, saturated).",
            ["model", "reason"], registry=r,
        )  # fmt: skip
        self.prefill_fallbacks = Counter(
            "dynamoctl_frontend_prefill_fallbacks",
            "Requests that fell back to a local prefill because remote prefill was not "
            "possible (reason: no_prefill_worker, prefill_failed, handoff_failed).",
            ["model", "reason"], registry=r,
        )  # fmt: skip
        self.migrations = Counter(
            "dynamoctl_frontend_migrations",
            "Streams re-issued to another worker after theirs failed.",
            labels, registry=r,
        )  # fmt: skip
