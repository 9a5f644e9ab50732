"""The OpenAI-compatible HTTP frontend: ``dynamoctl frontend`` (see docs/operations.md)."""
