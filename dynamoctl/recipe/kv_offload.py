"""A worker pool's ``kv_offload`` section: KV cache tiers below GPU memory, and what each
engine is told to get them (docs/recipes.md, "KV offload"; docs/architecture.md).

One declaration, :class:`KvOffload`; one translator per engine in :data:`OFFLOAD_ARGS`,
which returns the engine arguments, environment and directories the tiers need, or raises
:func:`rule_error` naming the field an engine cannot honour. The pool's validator calls
the translator, so a recipe an engine cannot serve fails when it is loaded, with its line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from dynamoctl.recipe.fields import NonEmptyStr, RecipeModel, rule_error
from dynamoctl.util.registry import Registry

GIB = 1 << 30


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


@dataclass
class OffloadArgs:
    """What a pool's engine needs for its tiers."""

    args: dict[str, Any] = field(default_factory=dict)
    """Engine arguments (names as in ``engine_args``)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment of each replica."""
    paths: dict[str, str] = field(default_factory=dict)
    """Directories each replica writes, by recipe field: checked on its node first."""


Translator = Callable[[KvOffload, int, Mapping[str, Any], int], OffloadArgs]
"""(section, gpus per replica, the pool's engine_args, model block size) → arguments."""
OFFLOAD_ARGS: Registry[Translator] = Registry("engine")
"""Per engine: how it gets the tiers (every engine in the recipe's ``Engine`` has one)."""


def _refuse(offload: KvOffload, engine: str, *fields: str) -> None:
    for name in fields:
        if getattr(offload, name) not in (None, True):
            raise rule_error(f"kv_offload.{name}", f"is not supported by {engine}")


@OFFLOAD_ARGS.register("mocker")
def _mocker(
    offload: KvOffload, gpus: int, engine_args: Mapping[str, Any], block_size: int
) -> OffloadArgs:
    from dynamoctl.engines.mocker.config import MockerConfig

    _refuse(offload, "the mocker", "shared_store", "backend")
    defaults = MockerConfig()
    get = {k.replace("-", "_"): v for k, v in engine_args.items()}.get
    block_bytes = block_size * int(get("kv_bytes_per_token", defaults.kv_bytes_per_token))
    gpu_blocks = int(get("num_gpu_blocks", defaults.num_gpu_blocks))
    host_blocks = math.floor(offload.host_gib * GIB / block_bytes)
    if host_blocks < gpu_blocks:
        raise rule_error(
            "kv_offload.host_gib",
            f"{offload.host_gib} GiB ({host_blocks} blocks of {block_bytes} bytes) is "
            f"smaller than the GPU KV cache ({gpu_blocks} blocks = "
            f"{gpu_blocks * block_bytes / GIB:.3g} GiB): it would churn",
        )
    out = OffloadArgs(
        args={"num_host_blocks": host_blocks, "disk_offload_filter": offload.disk_offload_filter}
    )
    if offload.disk_path is not None:
        if offload.disk_gib is None:
            raise rule_error("kv_offload.disk_gib", "is required by the mocker's disk tier")
        out.args["num_disk_blocks"] = math.floor(offload.disk_gib * GIB / block_bytes)
        out.args["disk_path"] = out.paths["kv_offload.disk_path"] = offload.disk_path
    return out


@OFFLOAD_ARGS.register("vllm")
def _vllm(
    offload: KvOffload, gpus: int, engine_args: Mapping[str, Any], block_size: int
) -> OffloadArgs:
    backend = offload.backend or ("native" if gpus else "lmcache")
    _refuse(offload, "vllm", "shared_store")
    if backend == "native":
        if not gpus:
            raise rule_error(
                "kv_offload.backend",
                "native offloading refuses vLLM's CPU build (gpus_per_replica: 0); use lmcache",
            )
        if offload.disk_path is not None:
            raise rule_error("kv_offload.disk_path", "needs backend: lmcache on vllm")
        return OffloadArgs(
            args={"kv_offloading_size": offload.host_gib, "kv_offloading_backend": "native"}
        )
    out = OffloadArgs(env={"LMCACHE_TRACK_USAGE": "false"})  # no telemetry posted outside
    if gpus:  # vLLM's own LMCache integration, in the engine's process
        out.args = {"kv_offloading_size": offload.host_gib, "kv_offloading_backend": "lmcache"}
    else:  # the CPU build: an LMCache server the worker starts (engines/vllm/lmcache.py)
        out.args = {"lmcache_l1_gib": offload.host_gib}
        if offload.disk_path is not None:
            raise rule_error(
                "kv_offload.disk_path",
                "is not supported with LMCache's multi-process server (vLLM's CPU build)",
            )
    if offload.disk_path is not None:
        out.env["LMCACHE_LOCAL_DISK"] = f"file://{offload.disk_path}"
        if offload.disk_gib is not None:
            out.env["LMCACHE_MAX_LOCAL_DISK_SIZE"] = f"{offload.disk_gib * GIB / 1e9:g}"
        out.paths["kv_offload.disk_path"] = offload.disk_path
    if not offload.disk_offload_filter:
        raise rule_error("kv_offload.disk_offload_filter", "LMCache has no such filter to turn off")
    return out


@OFFLOAD_ARGS.register("sglang")
def _sglang(
    offload: KvOffload, gpus: int, engine_args: Mapping[str, Any], block_size: int
) -> OffloadArgs:
    _refuse(offload, "sglang", "backend")
    if offload.disk_gib is not None:
        raise rule_error("kv_offload.disk_gib", "SGLang's file store has no size limit; omit it")
    # write_through_selective writes only blocks hit before: SGLang's frequency filter,
    # applied from GPU to host (HiCache backs up host blocks to its store).
    policy = "write_through_selective" if offload.disk_offload_filter else "write_through"
    size_gb = math.floor(offload.host_gib * GIB / 1e9)  # SGLang's --hicache-size: whole GB
    if size_gb < 1:
        raise rule_error("kv_offload.host_gib", "SGLang's hicache_size counts whole GB: >= 0.94")
    out = OffloadArgs(
        args={
            "enable_hierarchical_cache": True,
            "hicache_size": size_gb,
            "hicache_write_policy": policy,
        }
    )
    if offload.disk_path is not None and offload.shared_store is not None:
        raise rule_error("kv_offload.shared_store", "SGLang has one store: a disk or a shared one")
    if offload.disk_path is not None:
        out.args["hicache_storage_backend"] = "file"
        out.env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = offload.disk_path
        out.paths["kv_offload.disk_path"] = offload.disk_path
    elif offload.shared_store is not None:
        out.args["hicache_storage_backend"] = offload.shared_store
    return out


@OFFLOAD_ARGS.register("trtllm")
def _trtllm(
    offload: KvOffload, gpus: int, engine_args: Mapping[str, Any], block_size: int
) -> OffloadArgs:
    _refuse(offload, "trtllm", "disk_path", "shared_store", "backend")
    if not offload.disk_offload_filter:
        raise rule_error("kv_offload.disk_offload_filter", "applies to a disk tier only")
    cache = dict(engine_args.get("kv_cache_config") or {})
    size = int(offload.host_gib * GIB)
    if cache.get("host_cache_size", size) != size:
        raise rule_error(
            "engine_args.kv_cache_config",
            "host_cache_size contradicts kv_offload.host_gib; set it in one place",
        )
    cache["host_cache_size"] = size  # bytes of host memory for secondary KV blocks
    return OffloadArgs(args={"kv_cache_config": cache})


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
    return OFFLOAD_ARGS[engine](offload, gpus, engine_args, block_size)


def check_offload(role: str, engine: str, offload: KvOffload | None, gpus: int,
                  engine_args: Mapping[str, Any], block_size: int) -> None:  # fmt: skip
    """Refuse, naming ``workers.ROLE.<field>``, a ``kv_offload`` the engine cannot do."""
    try:
        offload_args(engine, offload, gpus, engine_args, block_size)
    except PydanticCustomError as exc:
        at = (exc.context or {}).get("at", "kv_offload")
        raise rule_error(f"workers.{role}.{at}", exc.message()) from None
