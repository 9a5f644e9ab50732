"""Names of the frontend's Prometheus metric families that another component reads (the
planner scrapes them, docs/metrics.md): declared here once, for the frontend that exports
them and the planner that parses them."""

from __future__ import annotations

TIME_TO_FIRST_TOKEN = "dynamoctl_frontend_time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "dynamoctl_frontend_inter_token_latency_seconds"
REQUESTS = "dynamoctl_frontend_requests"
REQUESTS_RECEIVED = "dynamoctl_frontend_requests_received"
INPUT_TOKENS = "dynamoctl_frontend_input_tokens"
OUTPUT_TOKENS = "dynamoctl_frontend_output_tokens"
CLASS_QUEUED = "dynamoctl_frontend_class_queued_requests"
"""A gauge: requests waiting in the admission queue for a busy worker, by priority class."""
