"""The plan's type: the deployment as placed (hosts, endpoint, every instance's spec).

Apart from :mod:`dynamoctl.plan.build`, which makes plans, because the run directory's state
holds one: ``status``, ``down`` and adoption read it without importing the recipe models
and the planner's settings that building a plan needs."""

from __future__ import annotations

import msgspec

from dynamoctl.launch.api import InstanceSpec
from dynamoctl.plan.hosts import Host


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    namespace: str
    target: str
    hosts: list[Host]
    discovery_url: str
    endpoint: str
    """The OpenAI base URL clients use."""
    model: str
    instances: list[InstanceSpec]

    def by_pool(self, pool: str) -> list[InstanceSpec]:
        return [spec for spec in self.instances if spec.pool == pool]
