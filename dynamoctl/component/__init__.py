"""The life every component process shares: signals, its HTTP server, discovery, records,
shutdown order (component/runtime.py, docs/architecture.md)."""
