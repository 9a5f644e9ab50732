"""A worker pool's ``kv_offload`` section: KV cache tiers below GPU memory, and what each
engine is told to get them (docs/recipes.md, "KV offload"; docs/architecture.md).

One declaration, :class:`KvOffload`; one translator per engine, in its spec
(``engines/<engine>/spec.py``, ``kv_offload``), which returns the engine arguments,
environment and directories the tiers need, or raises
:class:`~dynamoctl.engines.spec.OffloadRefused` naming the field an engine cannot honour
(here an error with the recipe's line). The pool's validator calls the translator, so a
recipe an engine cannot serve fails when it is loaded, with its line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from dynamoctl.engines.registry import engine_spec
from dynamoctl.engines.spec import OffloadArgs as OffloadArgs  # re-exported: the result
from dynamoctl.engines.spec import OffloadRefused
from dynamoctl.recipe.fields import NonEmptyStr, RecipeModel, rule_error


class KvOffload(RecipeModel):
    """KV cache tiers under each replica's GPU pool: blocks the GPU evicts are kept in host
    memory, then on a local disk, and loaded back on a prefix hit; the router credits
    each tier's hits (docs/router.md, "Tiers")."""

    host_gib: float = Field(gt=0)
    """Host-memory tier per replica, in GiB (at least the GPU KV cache, or it churns)."""
    disk_path: NonEmptyStr | None = None
    """Directory of a local-disk tier below host memory, on each worker's node (checked to
    exist and be writable there before anything starts)."""
    disk_gib: float | None = Field(default=None, gt=0)
    """Size of the disk tier in GiB; at least ``host_gib``. Needs ``disk_path``."""
    disk_offload_filter: bool = True
    """Write a block to disk only once it was reused (the frequency filter: it spares the
    drive one-off prompts); false: every block host memory evicts goes to disk."""
    shared_store: NonEmptyStr | None = None
    """A store shared by replicas below the local tiers: SGLang HiCache's storage backend
    name (``mooncake``, ``hf3fs``, ``nixl``), whose own settings go in the pool's ``env``.
    Other engines refuse it."""
    backend: Literal["native", "lmcache"] | None = None
    """vLLM only: ``native`` (vLLM's CPU offloading, GPUs only) or ``lmcache`` (LMCache;
    the only one on vLLM's CPU build). Default: native with GPUs, lmcache without."""

    @model_validator(mode="after")
    def _tiers_do_not_shrink(self) -> KvOffload:
        if self.disk_gib is not None and self.disk_path is None:
            raise rule_error("disk_gib", "needs disk_path (where the disk tier lives)")
        if self.disk_gib is not None and self.disk_gib < self.host_gib:
            raise rule_error(
                "disk_gib",
                f"{self.disk_gib} GiB is smaller than host_gib ({self.host_gib} GiB): a "
                "tier must hold at least the tier above it, or it churns",
            )
        return self


def offload_args(
    engine: str,
    offload: KvOffload | None,
    gpus: int,
    engine_args: Mapping[str, Any],
    block_size: int,
) -> OffloadArgs:
    """What ``engine`` needs for ``offload`` (nothing without one)."""
    if offload is None:
        return OffloadArgs()
    try:
        return engine_spec(engine).kv_offload(offload, gpus, engine_args, block_size)
    except OffloadRefused as exc:
        raise rule_error(exc.at, exc.message) from None


def check_offload(role: str, engine: str, offload: KvOffload | None, gpus: int,
                  engine_args: Mapping[str, Any], block_size: int) -> None:  # fmt: skip
    """Refuse, naming ``workers.ROLE.<field>``, a ``kv_offload`` the engine cannot do."""
    try:
        offload_args(engine, offload, gpus, engine_args, block_size)
    except PydanticCustomError as exc:
        at = (exc.context or {}).get("at", "kv_offload")
        raise rule_error(f"workers.{role}.{at}", exc.message()) from None
