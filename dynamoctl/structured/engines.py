"""What each engine can enforce, and the constraint in each engine's own terms.

vLLM enforces every constraint kind (its ``auto`` backend falls back from xgrammar to
guidance for JSON Schema features xgrammar lacks). SGLang and TensorRT-LLM enforce them
through xgrammar by default, which ignores a few JSON Schema keywords with a warning: a
schema using one is refused (400) rather than answered with output that may not validate.
The mocker answers what its generator can produce (:mod:`dynamoctl.structured.instances`).
"""

from __future__ import annotations

import json
import random
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from dynamoctl.engines.registry import ENGINES
from dynamoctl.engines.spec import Enforcement
from dynamoctl.structured.instances import Unsupported, example_text
from dynamoctl.wire.structured import OutputConstraint

XGRAMMAR_IGNORES = {
    "multipleOf": "number",
    "uniqueItems": "array",
    "contains": "array",
    "minContains": "array",
    "maxContains": "array",
}
"""JSON Schema keywords xgrammar does not enforce (vLLM's ``xgrammar`` backend lists the
same), with the type they constrain."""


def _anything(constraint: OutputConstraint) -> str | None:
    return None


def _xgrammar(constraint: OutputConstraint) -> str | None:
    if constraint.json_schema is None:
        return None
    for where, key in _keywords(constraint.json_schema, "#"):
        if key in XGRAMMAR_IGNORES:
            return (
                f"its grammar backend (xgrammar) does not enforce the JSON Schema keyword "
                f"'{key}' (at {where})"
            )
    return None


def _generated(constraint: OutputConstraint) -> str | None:
    try:
        example_text(constraint, random.Random(0))
    except Unsupported as exc:
        return str(exc)
    except RecursionError:
        return "the schema nests too deeply"
    return None


CHECKS: dict[Enforcement, Callable[[OutputConstraint], str | None]] = {
    "anything": _anything,
    "xgrammar": _xgrammar,
    "generated": _generated,
}
"""Why an engine that enforces this way cannot enforce a constraint, or None when it can
(each engine's spec says how it enforces: ``enforcement``)."""


def simulates(engine: str | None) -> bool:
    """Whether ``engine`` simulates a model (and so needs the request's tools and reasoning
    format to shape its output: :class:`~dynamoctl.wire.structured.OutputSpec`)."""
    return engine is not None and engine in ENGINES and ENGINES[engine].simulates


def refusal(engine: str | None, constraint: OutputConstraint) -> str | None:
    """Why ``engine`` cannot enforce ``constraint`` (None: it can)."""
    if engine is None:
        return "the model's workers do not say which engine serves it (an older dynamoctl)"
    if engine not in ENGINES:
        return f"dynamoctl does not know what engine '{engine}' can enforce"
    check = CHECKS[ENGINES[engine].enforcement]
    encoded = msgspec.json.encode(constraint)
    return cached(f"refusal/{engine}", lambda: check(constraint), encoded)


CACHE_ENTRIES = 256
CACHE_MAX_BYTES = 64 << 10
"""Checks of schemas are cached by their JSON text (agents send the same tools every
turn, and checking a schema costs milliseconds), up to this many entries of at most
this size each, so that a client sending large distinct schemas cannot grow it."""
_cache: OrderedDict[tuple[str, bytes], str | None] = OrderedDict()


def cached(kind: str, check: Callable[[], str | None], encoded: bytes) -> str | None:
    """``check()``'s answer about the value whose JSON is ``encoded``, remembered per
    ``(kind, encoded)`` (least recently used out)."""
    if len(encoded) > CACHE_MAX_BYTES:
        return check()
    key = (kind, encoded)
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    result = _cache[key] = check()
    if len(_cache) > CACHE_ENTRIES:
        _cache.popitem(last=False)
    return result


def _keywords(schema: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            yield where, key
            if key not in ("enum", "const", "default", "examples"):
                yield from _keywords(value, f"{where}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from _keywords(value, f"{where}/{i}")


# -- the constraint in each engine's terms ------------------------------------------------


def choice_regex(choice: list[str]) -> str:
    return "(" + "|".join(re.escape(option) for option in choice) + ")"


def vllm_fields(constraint: OutputConstraint) -> dict[str, Any]:
    """Keywords of vLLM's ``StructuredOutputsParams``."""
    kind = constraint.kind()
    if kind == "json_schema":
        return {"json": constraint.json_schema}
    return {kind: getattr(constraint, kind)}


def sglang_params(constraint: OutputConstraint) -> dict[str, Any]:
    """SGLang sampling parameters (``json_schema`` text, ``regex`` or ``ebnf``)."""
    if constraint.json_schema is not None:
        return {"json_schema": json.dumps(constraint.json_schema)}
    if constraint.regex is not None:
        return {"regex": constraint.regex}
    if constraint.choice is not None:
        return {"regex": choice_regex(constraint.choice)}
    if constraint.grammar is not None:
        return {"ebnf": constraint.grammar}
    return {"json_schema": json.dumps({"type": "object"})}


def trtllm_fields(constraint: OutputConstraint) -> dict[str, Any]:
    """Keywords of TensorRT-LLM's ``GuidedDecodingParams``."""
    if constraint.json_schema is not None:
        return {"json": constraint.json_schema}
    if constraint.choice is not None:
        return {"regex": choice_regex(constraint.choice)}
    kind = constraint.kind()
    return {kind: getattr(constraint, kind)}
