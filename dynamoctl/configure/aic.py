"""AI Configurator behind our interface: the only module that imports ``aiconfigurator``.

AI Configurator (``aiconfigurator`` 0.12.0, pinned: upstream deprecates it for
``aisimulate``, whose PyPI release is a stub) predicts serving performance from
per-operation latencies measured on real GPUs (docs/configure.md). We use two of its
surfaces: the configuration search (``cli_default``: agg and disagg sweeps, Pareto fronts,
best configurations under TTFT/TPOT targets) and its compiled step-latency engine
(prefill and decode step times of one engine instance), which the mocker's ``aic`` timing
and the planner profile read through :class:`StepLatency`. Imports are lazy: without
the ``configure`` extra every entry point raises :class:`ConfigureUnavailable` naming
the pip command.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dynamoctl.configure.models import (
    ENGINES,
    Answer,
    Candidate,
    ConfigureError,
    ConfigureUnavailable,
    FrontPoint,
    Mode,
    Parallel,
    Pool,
    Prediction,
    Question,
)

INSTALL_HINT = "pip install 'dynamoctl[configure]'"
PINNED = "0.12.0"
"""The AI Configurator release this wrapper reads (its DataFrame columns are not an API)."""

_LOGGERS = ("aiconfigurator", "aiconfigurator_core")


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigureUnavailable(
            f"AI Configurator is not installed ({exc.name}): {INSTALL_HINT}"
        ) from exc


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """AI Configurator logs every fallback table it loads at WARNING; our messages say
    what matters; its deprecation warnings (the pin is deliberate, docs/configure.md) are
    noise to an operator. Its CLI layer also calls ``sys.exit`` on some bad inputs."""
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in _LOGGERS]
    for logger, _ in saved:
        logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    except SystemExit as exc:
        raise ConfigureError(f"AI Configurator refused the input (exit {exc.code})") from None
    finally:
        for logger, level in saved:
            logger.setLevel(level)


# -- what AI Configurator has data for -------------------------------------------------------


@functools.cache
def shipped_models() -> tuple[str, ...]:
    """Model ids whose config.json AI Configurator ships (usable offline)."""
    utils = _module("aiconfigurator_core.sdk.utils")
    folder = Path(utils._get_model_config_path())
    return tuple(
        sorted(
            p.name.removesuffix("_config.json").replace("--", "/", 1)
            for p in folder.glob("*_config.json")
        )
    )


@functools.cache
def databases() -> dict[str, dict[str, tuple[str, ...]]]:
    """Performance data: system → engine → versions (oldest first)."""
    pdb = _module("aiconfigurator_core.sdk.perf_database")
    with _quiet():
        found = pdb.get_supported_databases()
    return {
        system: {engine: tuple(versions) for engine, versions in sorted(engines.items())}
        for system, engines in sorted(found.items())
    }


def resolve_model(model: str) -> str:
    """``model`` as AI Configurator takes it: a local directory holding config.json (its
    absolute path) or a shipped id; anything else is refused, offline, with the fix."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigureError(f"--model {model}: the directory has no config.json")
        return str(path.resolve())
    if model in shipped_models():
        return model
    raise ConfigureError(
        f"--model {model}: not a model AI Configurator ships and not a local directory; "
        "configure works offline, so download the model's config.json (Hugging Face: "
        "Files > config.json) into a directory and pass that directory. Shipped ids: "
        + ", ".join(m for m in shipped_models() if "/" in m)
    )


def check_data(system: str, engine: str, version: str | None) -> str:
    """The data version to use for ``engine`` on ``system``, or an error listing what exists."""
    data = databases()
    if system not in data:
        raise ConfigureError(
            f"system {system}: no performance data; systems with data: {', '.join(data)}"
        )
    if engine not in ENGINES or engine not in data[system]:
        have = ", ".join(f"{e} ({', '.join(v)})" for e, v in data[system].items())
        raise ConfigureError(f"engine {engine}: no data on {system}; engines there: {have}")
    versions = data[system][engine]
    if version is None:  # AI Configurator's own default: its "current" slot
        pdb = _module("aiconfigurator_core.sdk.perf_database")
        with _quiet():
            slots = pdb.get_version_slots(system, engine) or {}
        return str(slots.get("current", versions[-1]))
    if version not in versions:
        raise ConfigureError(
            f"engine version {version}: no {engine} data on {system}; versions: "
            + ", ".join(versions)
        )
    return version


def model_facts(model: str) -> dict[str, Any]:
    """Layer count, KV heads, head size, context length of ``model`` (resolved)."""
    utils = _module("aiconfigurator_core.sdk.utils")
    with _quiet():
        facts: dict[str, Any] = utils.get_model_config_from_model_path(model)
    return facts


def kv_bytes_per_token(model: str) -> int:
    """KV bytes of one token over all layers, K and V in 16-bit (MLA models: an upper
    bound)."""
    facts = model_facts(model)
    return int(2 * facts["layers"] * facts["n_kv"] * facts["d"] * 2)


# -- the configuration search ----------------------------------------------------------------


def answer(question: Question) -> Answer:
    """Search agg and disagg configurations for ``question`` (about 5 s for a 70B model on
    16 GPUs); :class:`ConfigureError` when nothing meets the targets, naming the binding
    one and the best figures reachable."""
    model = resolve_model(question.model)
    version = check_data(question.system, question.engine, question.engine_version)
    api = _module("aiconfigurator.cli.api")
    errors = _module("aiconfigurator_core.sdk.errors")
    try:
        with _quiet():
            result = api.cli_default(
                model_path=model, total_gpus=question.gpus, system=question.system,
                backend=question.engine, backend_version=version, isl=question.isl,
                osl=question.osl, ttft=question.ttft_ms, tpot=question.tpot_ms,
                top_n=question.top_n,
            )  # fmt: skip
    except errors.NoFeasibleConfigError:
        raise ConfigureError(_unreachable(question, model, version)) from None
    candidates: list[Candidate] = []
    fronts: dict[str, tuple[FrontPoint, ...]] = {}
    for mode in ("agg", "disagg"):
        best = result.best_configs.get(mode)
        if best is not None and len(best):
            found = [_candidate(mode, rank, row, question.gpus) for rank, row in _rows(best)]
            candidates += [c for c in found if _meets(c, question)]
        front = result.pareto_fronts.get(mode)
        if front is not None and len(front):
            fronts[mode] = tuple(
                FrontPoint(float(r["tokens/s/user"]), float(r["tokens/s/gpu"]))
                for _, r in _rows(front)
            )
    if not candidates:
        raise ConfigureError(_unreachable(question, model, version))
    chosen: Mode = "disagg" if str(result.chosen_exp).startswith("disagg") else "agg"
    return Answer(
        question=question, engine_version=version, candidates=tuple(candidates),
        fronts=fronts, chosen=chosen,
    )  # fmt: skip


def _meets(candidate: Candidate, question: Question) -> bool:
    # With no configuration under the targets AI Configurator still returns its closest.
    p = candidate.predicted
    return p.ttft_ms <= question.ttft_ms and p.tpot_ms <= question.tpot_ms


def _rows(frame: Any) -> Iterator[tuple[int, Any]]:
    for rank, (_, row) in enumerate(frame.iterrows(), 1):
        yield rank, row


def _parallel(row: Any, prefix: str = "") -> Parallel:
    def size(name: str) -> int:
        value = row.get(prefix + name, 1)
        return int(value) if value == value and value else 1  # NaN / 0: not parallel

    return Parallel(
        tp=size("tp"), pp=size("pp"), dp=size("dp"), moe_tp=size("moe_tp"), moe_ep=size("moe_ep")
    )


def _candidate(mode: Mode, rank: int, row: Any, gpus: int) -> Candidate:
    unit = int(row["num_total_gpus"])
    pools: dict[str, Pool] = {}
    if mode == "agg":
        pools["agg"] = Pool(parallel=_parallel(row), batch_size=int(row["bs"]), workers=1)
    else:
        for role, prefix in (("prefill", "(p)"), ("decode", "(d)")):
            pools[role] = Pool(
                parallel=_parallel(row, prefix),
                batch_size=int(row[prefix + "bs"]),
                workers=int(row[prefix + "workers"]),
            )
    predicted = Prediction(
        ttft_ms=float(row["ttft"]),
        tpot_ms=float(row["tpot"]),
        tokens_per_s_gpu=float(row["tokens/s/gpu"]),
        tokens_per_s_user=float(row["tokens/s/user"]),
        request_rate=float(row["request_rate"]),
    )
    return Candidate(
        mode=mode, rank=rank, gpus_per_unit=unit, units=max(1, gpus // unit),
        concurrency=int(row["concurrency"]), predicted=predicted, **pools,
    )  # fmt: skip


def _unreachable(question: Question, model: str, version: str) -> str:
    """Why nothing met the targets: search again without them and compare."""
    api = _module("aiconfigurator.cli.api")
    loose = 1e7
    try:
        with _quiet():
            result = api.cli_default(
                model_path=model, total_gpus=question.gpus, system=question.system,
                backend=question.engine, backend_version=version, isl=question.isl,
                osl=question.osl, ttft=loose, tpot=loose, top_n=1,
            )  # fmt: skip
    except Exception:  # nothing fits at all (model too large for the GPUs)
        return (
            f"no configuration of {question.model} fits {question.gpus} x {question.system} "
            "at any latency (the weights and KV cache do not fit); give more GPUs"
        )
    ttft = min(float(f["ttft"].min()) for f in result.pareto_fronts.values() if len(f))
    tpot = min(float(f["tpot"].min()) for f in result.pareto_fronts.values() if len(f))
    binding = [
        f"{name} {target:g} ms (best reachable {best:.1f} ms)"
        for name, target, best in (
            ("TTFT", question.ttft_ms, ttft),
            ("TPOT", question.tpot_ms, tpot),
        )
        if best > target
    ]
    what = " and ".join(binding) or (
        f"TTFT {question.ttft_ms:g} ms and TPOT {question.tpot_ms:g} ms together (each is "
        f"reachable alone: TTFT {ttft:.1f} ms, TPOT {tpot:.1f} ms, not in one configuration)"
    )
    return (
        f"no configuration of {question.model} on {question.gpus} x {question.system} "
        f"({question.engine} {version}, ISL {question.isl}, OSL {question.osl}) meets {what}; "
        "relax --ttft/--tpot, shorten --isl, or give more GPUs"
    )


# -- step latencies of one engine instance ---------------------------------------------------


class StepLatency:
    """Prefill and decode step times of one engine instance, from AI Configurator's
    compiled engine (microseconds per call after a ~3 s compile)."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def prefill_ms(self, tokens: int) -> float:
        """One forward pass over ``tokens`` new prompt tokens (one sequence)."""
        return float(self._handle.predict_prefill_latency(1, max(1, tokens)))

    def decode_ms(self, batch: int, context: int) -> float:
        """One decode step of ``batch`` requests whose contexts are ``context`` tokens."""
        return float(self._handle.predict_decode_latency(max(1, batch), max(1, context), 2))


def step_latency(
    model: str, system: str, engine: str, version: str | None, parallel: Parallel
) -> StepLatency:
    """The step-latency engine of ``model`` on ``system`` with ``parallel``."""
    resolved = resolve_model(model)
    literal = check_data(system, engine, version)
    core = _module("aiconfigurator_core.sdk.engine")
    moe = _is_moe(resolved)
    try:
        with _quiet():
            handle = core.EngineHandle.compile(
                resolved, system, engine, backend_version=literal, tp_size=parallel.tp,
                pp_size=parallel.pp, attention_dp_size=parallel.dp,
                moe_tp_size=parallel.moe_tp if moe else None,
                moe_ep_size=parallel.moe_ep if moe else None,
            )  # fmt: skip
    except ConfigureError:
        raise
    except Exception as exc:
        raise ConfigureError(
            f"AI Configurator cannot model {model} on {system} with {parallel.label()}: {exc}"
        ) from exc
    return StepLatency(handle)


MEMORY_FRACTION = {
    "vllm": ("of_total", 0.9),
    "sglang": ("of_total", 0.9),
    "trtllm": ("of_free", 0.9),
}
"""The share of GPU memory each engine gives weights + KV by default (vLLM's
``gpu-memory-utilization``; SGLang about its ``mem-fraction-static``; TensorRT-LLM's
``free_gpu_memory_fraction``, of what the weights leave)."""


def kv_capacity_tokens(
    model: str,
    system: str,
    engine: str,
    version: str | None,
    parallel: Parallel,
    *,
    max_batch: int,
    max_step_tokens: int,
) -> int:
    """KV-cache tokens one instance holds, from AI Configurator's memory model (weights,
    activations at the step budget, the engine's memory fraction)."""
    resolved = resolve_model(model)
    literal = check_data(system, engine, version)
    memory = _module("aiconfigurator_core.sdk.memory")
    kind, fraction = MEMORY_FRACTION[engine]
    moe = _is_moe(resolved)
    try:
        with _quiet():
            estimate = memory.estimate_kv_cache(
                resolved, system, engine, literal, max_num_tokens=max_step_tokens,
                max_batch_size=max_batch, memory_fraction_kind=kind,
                memory_fraction_value=fraction, tp_size=parallel.tp, pp_size=parallel.pp,
                attention_dp_size=parallel.dp, moe_tp_size=parallel.moe_tp if moe else None,
                moe_ep_size=parallel.moe_ep if moe else None,
            )  # fmt: skip
    except ValueError as exc:
        raise ConfigureError(f"AI Configurator cannot size the KV cache: {exc}") from exc
    return int(estimate["total_kv_size_tokens"])


def _is_moe(model: str) -> bool:
    return bool(model_facts(model).get("num_experts"))


def geometric(lo: int, hi: int, ratio: float = 2**0.5) -> list[int]:
    """Whole numbers from ``lo`` to ``hi`` spaced by about ``ratio`` (both ends kept)."""
    points, x = [lo], float(lo)
    while points[-1] < hi:
        x = max(x * ratio, points[-1] + 1)
        points.append(min(hi, math.ceil(x)))
    return points
