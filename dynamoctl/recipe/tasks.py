"""The rules of a recipe's model task (``model.task``): what an embedding model may be
served by."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

from dynamoctl.engines.registry import engine_spec
from dynamoctl.recipe.fields import rule_error
from dynamoctl.wire.roles import Role

Task = Literal["generate", "embed"]
"""What the model does: generate text, or embed its input (a pooling model)."""


class _Pool(Protocol):
    @property
    def engine(self) -> str: ...


def check_task(task: Task, pools: Mapping[Role, _Pool]) -> None:
    """An embedding model runs in an ``agg`` pool of an engine with a pooling runner."""
    if task != "embed":
        return
    for role, pool in pools.items():
        if role != "agg":
            raise rule_error(
                f"workers.{role}",
                "model.task embed is served by an agg pool only: an embedding is one "
                "prefill, there is nothing to disaggregate",
            )
        if engine_spec(pool.engine).embed_args is None:
            raise rule_error(
                f"workers.{role}.engine",
                f"{pool.engine} serves no embeddings here (model.task embed); use vllm or mocker",
            )
