"""Structured outputs and tool calling at the frontend: the request fields, what they
ask of the engine, and how the answer is read back (docs/api.md, "Structured outputs,
tools and reasoning")."""
