"""LoRA adapters: what the supervisor asks workers to hold (a discovery value, no lease)
and what ``dynamoctl lora`` sends and shows (docs/api.md, "LoRA adapters")."""

from __future__ import annotations

import msgspec


class AdapterSpec(msgspec.Struct, frozen=True, kw_only=True):
    """``{ns}/adapters/{name}``: an adapter the deployment serves."""

    name: str
    """Served model name of the adapter (what requests put in ``model``)."""
    path: str
    """Directory of the adapter (``adapter_config.json`` and its weights) on the workers'
    hosts."""
    pools: list[str]
    """Worker pools (roles) that load it."""
    base_model: str | None = None
    """The base model the adapter was trained on (its config's ``base_model_name_or_path``
    must name it), when checked; None: not checked."""


class LoraLoadRequest(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /lora/load`` of the supervisor's control endpoint."""

    name: str
    path: str
    pools: list[str] = []
    """Empty: every pool whose recipe enables LoRA."""
    base_model: str | None = None


class LoraUnloadRequest(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /lora/unload``."""

    name: str


class AdapterHolders(msgspec.Struct, frozen=True, kw_only=True):
    """One adapter and the workers that hold it now."""

    spec: AdapterSpec
    workers: list[str]
    """Labels (``agg-0``) or instance ids of the workers that loaded it."""


class LoraReport(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /lora``: every adapter asked for, and who holds it."""

    adapters: list[AdapterHolders]
