"""Deployments for the observability tests: the supervisor tests' ``dynamoctl`` runner."""

from tests.supervisor.conftest import cli

__all__ = ["cli"]
