"""The worker pools' roles, and which of them prefill and which decode: one declaration
for the recipe, the plan, the router and the planner."""

from __future__ import annotations

from typing import Literal

Role = Literal["agg", "prefill", "decode"]
"""A worker pool: aggregated (prefills and decodes), or one side of a disaggregated pair."""

PLACEMENT_ORDER: tuple[Role, ...] = ("prefill", "decode", "agg")
"""The order the plan places pools in, and of their per-pool port blocks."""

PREFILL_ROLES: frozenset[str] = frozenset({"prefill", "agg"})
"""Roles whose workers prefill (they answer for time to first token)."""

DECODE_ROLES: frozenset[str] = frozenset({"decode", "agg"})
"""Roles whose workers decode (they answer for inter-token latency)."""
