"""Engine arguments on a command line: ``--num-gpu-blocks 4096 --enforce-eager``.

The supervisor renders a recipe's ``engine_args`` this way and the worker parses them
back; values are JSON when they parse as JSON (numbers, booleans, objects such as
``--kv-transfer-config '{"kv_connector": "NixlConnector"}'``), strings otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def parse_engine_args(args: Sequence[str]) -> dict[str, Any]:
    """``["--a-b", "1", "--flag", "--no-c"]`` → ``{"a_b": 1, "flag": True, "c": False}``."""
    options: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ValueError(f"engine argument {arg!r} should look like --name [value]")
        name, eq, inline = arg[2:].partition("=")
        if eq:
            value: Any = _value(inline)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = _value(args[i + 1])
            i += 2
        else:
            value = True
            if name.startswith("no-"):
                name, value = name[3:], False
            i += 1
        options[name.replace("-", "_")] = value
    return options


def render_engine_args(options: Mapping[str, Any]) -> list[str]:
    """Inverse of :func:`parse_engine_args` (sorted, so rendered commands are stable)."""
    out: list[str] = []
    for name, value in sorted(options.items()):
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + name.replace("_", "-"))
        elif isinstance(value, str) and not _looks_like_json(value):
            out += [flag, value]
        else:  # numbers, objects, and strings that would otherwise parse as JSON
            out += [flag, json.dumps(value)]
    return out


def _looks_like_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
