"""Example outputs that satisfy a constraint: a JSON value for a JSON Schema, a string for
a regular expression, one of a choice. The mocker answers structured requests with them
(:mod:`dynamoctl.engines.mocker.output`), and the frontend asks the same code whether the
mocker can answer a schema at all (so a schema it cannot is a 400, not a wrong answer).

Every instance is checked against its schema (``jsonschema``) or pattern before it is
returned: a keyword the generator does not model makes :class:`Unsupported`, never an
invalid answer.
"""

from __future__ import annotations

import importlib
import json
import random
import re
import string
import sys
import uuid
from collections.abc import Callable
from typing import Any

import jsonschema

from dynamoctl.wire.structured import OutputConstraint

# The regex parser and its opcodes (a pattern is walked to build a match); private
# modules since 3.11, whose old names warn.
_NEW = sys.version_info >= (3, 11)
sre: Any = importlib.import_module("re._constants" if _NEW else "sre_constants")
sre_parse: Any = importlib.import_module("re._parser" if _NEW else "sre_parse")

WORDS = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
    "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
    "sierra", "tango", "uniform", "victor", "whiskey", "yankee", "zulu",
]  # fmt: skip
UNMODELLED = (
    "not", "if", "then", "else", "dependentSchemas", "dependentRequired", "patternProperties",
    "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains", "minContains",
    "maxContains", "$dynamicRef", "minProperties", "maxProperties",
)  # fmt: skip
"""Keywords the generator does not satisfy by construction (refused up front)."""
MAX_DEPTH = 6
"""Below this nesting, objects get their required properties only and arrays their
fewest items, so a recursive schema ends."""


class Unsupported(ValueError):
    """A constraint this generator cannot produce an instance of; the message says why."""


def example_text(constraint: OutputConstraint, rng: random.Random) -> str:
    """Text satisfying ``constraint``."""
    if constraint.choice is not None:
        return rng.choice(constraint.choice)
    if constraint.regex is not None:
        return regex_instance(constraint.regex, rng)
    if constraint.grammar is not None:
        raise Unsupported("it cannot generate text from a grammar")
    if constraint.json_schema is not None:
        return json.dumps(json_instance(constraint.json_schema, rng), ensure_ascii=False)
    return json.dumps({"answer": rng.choice(WORDS), "score": rng.randint(0, 100)})


# -- JSON Schema -----------------------------------------------------------------------------


def json_instance(schema: dict[str, Any], rng: random.Random) -> Any:
    """A value valid against ``schema`` (a checked JSON Schema)."""
    value = _Generator(schema, rng).value(schema, 0)
    validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        where = "/".join(map(str, error.absolute_schema_path)) or "the root"
        raise Unsupported(f"it could not satisfy the schema at {where}: {error.message}")
    return value


class _Generator:
    def __init__(self, root: dict[str, Any], rng: random.Random) -> None:
        self.root, self.rng = root, rng

    def value(self, schema: Any, depth: int) -> Any:
        if schema is True or schema == {}:
            return self.rng.choice(WORDS)
        if not isinstance(schema, dict):
            raise Unsupported("a schema of false has no instance")
        for key in UNMODELLED:
            if key in schema:
                raise Unsupported(f"it does not model the keyword '{key}'")
        if "$ref" in schema:
            return self.value(self._resolve(schema["$ref"]), depth + 1)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return self.rng.choice(schema["enum"])
        if "allOf" in schema:
            return self.value(self._merged(schema), depth)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                rest = {k: v for k, v in schema.items() if k != key}
                return self.value({**rest, **self.rng.choice(schema[key])}, depth + 1)
        return getattr(self, "_" + self._type(schema))(schema, depth)

    def _type(self, schema: dict[str, Any]) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            concrete = [k for k in kind if k != "null"] or kind
            kind = concrete[0]
        if kind is None:
            if "properties" in schema or "required" in schema:
                return "object"
            if "items" in schema or "prefixItems" in schema:
                return "array"
            numeric = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
            return "number" if any(k in schema for k in numeric) else "string"
        if kind not in ("object", "array", "string", "integer", "number", "boolean", "null"):
            raise Unsupported(f"unknown type '{kind}'")
        return str(kind)

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise Unsupported(f"it resolves only local references, not '{ref}'")
        node: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise Unsupported(f"the reference '{ref}' points nowhere")
            node = node[part]
        return node

    def _merged(self, schema: dict[str, Any]) -> dict[str, Any]:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            part = self._resolve(part["$ref"]) if "$ref" in part else part
            for key, value in part.items():
                if key == "properties":
                    merged["properties"] = {**merged.get("properties", {}), **value}
                elif key == "required":
                    merged["required"] = [*merged.get("required", []), *value]
                else:
                    merged[key] = value
        return merged

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        out = {}
        for name, sub in properties.items():
            if name in required or (depth < MAX_DEPTH and self.rng.random() < 0.5):
                out[name] = self.value(sub, depth + 1)
        for name in required - set(properties):
            extra = schema.get("additionalProperties", True)
            out[name] = self.value(extra if isinstance(extra, dict) else True, depth + 1)
        return out

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems", [])
        low = schema.get("minItems", 0)
        high = schema.get("maxItems", low + 3)
        if schema.get("items") is False:  # no items past the prefix
            high = min(high, len(prefix))
        count = low if depth >= MAX_DEPTH else self.rng.randint(low, max(low, min(high, low + 3)))
        items = schema.get("items", True)
        out: list[Any] = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else items
            for _ in range(20):  # uniqueItems: draw again on a repeat
                value = self.value(sub, depth + 1)
                if not schema.get("uniqueItems") or value not in out:
                    break
            else:
                if len(out) >= low:
                    break  # no new value left: enough items already
            out.append(value)
        return out

    def _string(self, schema: dict[str, Any], depth: int) -> str:
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if "pattern" in schema:
            for _ in range(20):
                text = regex_instance(schema["pattern"], self.rng)
                if len(text) >= low and (high is None or len(text) <= high):
                    return text
            raise Unsupported("its pattern and length bounds did not meet")
        fmt = schema.get("format")
        if fmt in FORMATS:
            return FORMATS[fmt](self.rng)
        text = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 3)))
        while len(text) < low:
            text += " " + self.rng.choice(WORDS)
        return text if high is None else text[:high]

    def _integer(self, schema: dict[str, Any], depth: int) -> int:
        low, high = self._bounds(schema, 1)
        step = schema.get("multipleOf", 1)
        if not isinstance(step, int) or step <= 0:
            raise Unsupported("it supports an integer multipleOf only")
        first, last = -(-int(low) // step), int(high) // step
        if first > last:
            raise Unsupported("its integer bounds leave no multiple")
        return self.rng.randint(first, min(last, first + 100)) * step

    def _number(self, schema: dict[str, Any], depth: int) -> float | int:
        if "multipleOf" in schema:
            step: float = schema["multipleOf"]
            return self._integer({**schema, "multipleOf": 1}, depth) * step
        low, high = self._bounds(schema, 0.01)
        return round(self.rng.uniform(low, min(high, low + 1000)), 2)

    def _bounds(self, schema: dict[str, Any], epsilon: float) -> tuple[float, float]:
        low = schema.get("minimum", -1000 if "maximum" in schema else 0)
        high = schema.get("maximum", low + 1000)
        if "exclusiveMinimum" in schema:
            low = max(low, schema["exclusiveMinimum"] + epsilon)
        if "exclusiveMaximum" in schema:
            high = min(high, schema["exclusiveMaximum"] - epsilon)
        if low > high:
            raise Unsupported("its numeric bounds are empty")
        return low, high

    def _boolean(self, schema: dict[str, Any], depth: int) -> bool:
        return self.rng.random() < 0.5

    def _null(self, schema: dict[str, Any], depth: int) -> None:
        return None


FORMATS: dict[str, Callable[[random.Random], str]] = {
    "date-time": lambda r: f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}T12:00:00Z",
    "date": lambda r: f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
    "time": lambda r: f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:00Z",
    "email": lambda r: f"{r.choice(WORDS)}@example.com",
    "uuid": lambda r: str(uuid.UUID(int=r.getrandbits(128), version=4)),
    "uri": lambda r: f"https://example.com/{r.choice(WORDS)}",
    "hostname": lambda r: f"{r.choice(WORDS)}.example.com",
    "ipv4": lambda r: ".".join(str(r.randint(1, 254)) for _ in range(4)),
}


# -- regular expressions ---------------------------------------------------------------------

_PRINTABLE = string.ascii_letters + string.digits + " _-.,:"
_CATEGORIES = {
    sre.CATEGORY_DIGIT: string.digits,
    sre.CATEGORY_WORD: string.ascii_letters + string.digits + "_",
    sre.CATEGORY_SPACE: " ",
    sre.CATEGORY_NOT_DIGIT: string.ascii_letters,
    sre.CATEGORY_NOT_WORD: " -.,:",
    sre.CATEGORY_NOT_SPACE: string.ascii_letters + string.digits,
}


def regex_instance(pattern: str, rng: random.Random) -> str:
    """A string the whole of ``pattern`` (Python syntax) matches."""
    try:
        compiled = re.compile(pattern)
        parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise Unsupported(f"the regular expression does not compile: {exc}") from None
    text = _Regex(rng).walk(parsed)
    if compiled.fullmatch(text) is None:
        raise Unsupported(f"it could not produce a match of the regular expression {pattern!r}")
    return text


class _Regex:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def walk(self, items: Any) -> str:
        return "".join(self.item(op, arg) for op, arg in items)

    def item(self, op: Any, arg: Any) -> str:
        rng = self.rng
        if op is sre.LITERAL:
            return chr(arg)
        if op is sre.NOT_LITERAL:
            return next(c for c in _PRINTABLE if ord(c) != arg)
        if op is sre.ANY:
            return rng.choice(string.ascii_letters)
        if op is sre.IN:
            return self.pick(arg)
        if op is sre.BRANCH:
            return self.walk(rng.choice(arg[1]))
        if op is sre.SUBPATTERN:
            return self.walk(arg[-1])
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            low, high, inner = arg
            high = low + 3 if high is sre.MAXREPEAT else high
            return "".join(self.walk(inner) for _ in range(rng.randint(low, min(high, low + 3))))
        if op is sre.ATOMIC_GROUP:
            return self.walk(arg)
        if op is sre.AT:
            return ""  # anchors: the whole output is the match anyway
        raise Unsupported(f"it does not model the regular expression construct {op}")

    def pick(self, items: list[tuple[Any, Any]]) -> str:
        negate = bool(items) and items[0][0] is sre.NEGATE
        members = items[1:] if negate else items
        if negate:
            allowed = [c for c in _PRINTABLE if not any(_has(op, a, c) for op, a in members)]
        else:
            allowed = []
            for op, arg in members:
                if op is sre.LITERAL:
                    allowed.append(chr(arg))
                elif op is sre.RANGE:
                    allowed += [chr(c) for c in range(arg[0], min(arg[1], arg[0] + 60) + 1)]
                elif op is sre.CATEGORY:
                    allowed += _CATEGORIES.get(arg, "")
        if not allowed:
            raise Unsupported("a character class it cannot satisfy")
        return self.rng.choice(allowed)


def _has(op: Any, arg: Any, char: str) -> bool:
    if op is sre.LITERAL:
        return bool(ord(char) == arg)
    if op is sre.RANGE:
        return bool(arg[0] <= ord(char) <= arg[1])
    if op is sre.CATEGORY:
        return char in _CATEGORIES.get(arg, "")
    return False
