"""What a launcher stages ahead of the engines (recipe ``model.cache.stage_ahead``): the
model directories the recipe's workers would each stage at their start, and the cache's
settings (docs/operations.md, "Model cache")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dynamoctl.engines.registry import engine_spec
from dynamoctl.recipe.models import Recipe
from dynamoctl.settings.model_cache import ModelCacheSettings


@dataclass(frozen=True)
class Ahead:
    """What to stage onto every node before any engine starts, and into which cache."""

    sources: list[str]
    settings: ModelCacheSettings


def ahead(recipe: Recipe) -> Ahead | None:
    """What the recipe asks to stage ahead; None when it does not."""
    cache = recipe.model.cache
    if cache is None or not cache.stage_ahead:
        return None
    settings = ModelCacheSettings(**cache.model_dump(include=set(ModelCacheSettings.model_fields)))
    return Ahead(weights_sources(recipe), settings)


def weights_sources(recipe: Recipe) -> list[str]:
    """Each pool's weights directory: its engine's weights argument from ``engine_args``,
    else ``model.path`` where that argument is the model's (vLLM, SGLang, TensorRT-LLM);
    only directories (a model id is downloaded by the engine, not staged), each once."""
    found: list[str] = []
    for pool in recipe.workers.pools().values():
        key = engine_spec(pool.engine).weights_arg
        if key is None:
            continue
        given = {k.replace("-", "_"): v for k, v in pool.engine_args.items()}.get(key)
        source = str(given) if given is not None else None
        if source is None and key == "model":
            source = recipe.model.path
        if source is not None and Path(source).is_dir() and source not in found:
            found.append(source)
    return found
