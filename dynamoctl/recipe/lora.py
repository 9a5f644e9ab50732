"""A worker pool's ``lora`` section: LoRA adapters served beside the base model
(docs/api.md, "LoRA adapters"). The engine is told the capacity (its spec's
``lora_args``); the adapters are the supervisor's to hand out: it writes each to
discovery at ``up``, as ``dynamoctl lora load`` does at run time, and the pool's workers
load them."""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from dynamoctl.recipe.fields import NonEmptyStr, RecipeModel, rule_error

ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
"""What an adapter's served name may be: it is a model name in requests and a discovery
key segment (no ``/``)."""


class Adapter(RecipeModel):
    """One LoRA adapter."""

    name: NonEmptyStr
    """Served model name: requests with this ``model`` generate with the adapter. Letters,
    digits, ``.``, ``_``, ``:``, ``-``; no ``/``."""
    path: NonEmptyStr
    """Directory of the adapter as peft saves it (``adapter_config.json`` and its
    weights), on every worker host of the pool."""
    base_model: NonEmptyStr | None = None
    """The base model the adapter was trained on: a worker refuses to load an adapter
    whose ``adapter_config.json`` names another (``base_model_name_or_path``). Default:
    not checked."""

    @model_validator(mode="after")
    def _name_is_a_model_name(self) -> Adapter:
        if not ADAPTER_NAME.fullmatch(self.name):
            raise rule_error(
                "name", f"{self.name!r}: use letters, digits, '.', '_', ':' or '-' (no '/')"
            )
        return self


class Lora(RecipeModel):
    """LoRA adapters of a worker pool, and the engine's room for them."""

    max_loras: int = Field(default=4, ge=1, le=256)
    """Most adapters one replica holds at once (vLLM's ``--max-loras``; the mocker's
    ``max_loras``): a load beyond it is refused on that replica."""
    max_rank: int = Field(default=16, ge=1, le=512)
    """Largest adapter rank the engine makes room for (vLLM's ``--max-lora-rank``)."""
    adapters: list[Adapter] = Field(default_factory=list)
    """Adapters loaded when the deployment starts (more with ``dynamoctl lora load``)."""

    @model_validator(mode="after")
    def _names_unique(self) -> Lora:
        seen: set[str] = set()
        for i, adapter in enumerate(self.adapters):
            if adapter.name in seen:
                raise rule_error(f"adapters[{i}].name", f"{adapter.name!r} is declared twice")
            seen.add(adapter.name)
        if len(self.adapters) > self.max_loras:
            raise rule_error(
                "adapters",
                f"{len(self.adapters)} adapters, but max_loras is {self.max_loras}: raise "
                "max_loras or declare fewer",
            )
        return self
