"""The worker process: an engine behind the request plane (see docs/operations.md)."""
