"""Deployments for the planner tests: the supervisor tests' ``dynamoctl`` runner."""

from tests.supervisor.conftest import cli

__all__ = ["cli"]
