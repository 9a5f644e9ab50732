"""A seeded mutator of recipe files, for the fuzz test: mostly the inputs that used to
crash or stall the loader and the dry run (deep nesting, recursive and exploding aliases,
tags, complex keys, bytes that are not UTF-8, control characters, huge numbers), spliced
into the shipped recipes at random places."""

from __future__ import annotations

import random
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEEDS = sorted([*REPO.glob("recipes/*.yaml"), *REPO.glob("tests/supervisor/recipes/*.yaml")])


def _bomb(levels: int = 8, width: int = 9) -> str:
    lines = [f"x-b0: &b0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"x-b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * width)}]")
    return "\n".join(lines)


VALUES = [
    "1000000000", "99999999999999999999999999", "-1", "0", "1e308", ".inf", "-.inf", ".nan",
    "0x7fffffff", "!foo x", "!foo {a: 1}", "!!binary aGVsbG8=", "!!set {a}", "!!omap [a: 1]",
    "!!timestamp 2001-12-14", "!!python/object/apply:os.system [true]", "!!str 1", "! x",
    "!<tag:example.com,2000:x> 1", "2024-01-01", "2001-12-14t21:59:43.10-05:00", "=",
    "[" * 500 + "]" * 500, "{a: " * 300 + "1" + "}" * 300, "{? [a, b] : c}", "{? {a: 1} : c}",
    "&s [*s]", "&m {a: *m}", "&m {<<: *m}", "*undefined", "~", "true", "''", "[]", "{}",
    "[a, b]", "{a: 1}", '"\\x00"', '"a\\u0007b"', '"\\ud800"', '"\\x1b[31m"', "@", "`x", "|",
    ">", "'x' 'y'", "{a: 1, a: 2}", "127.0.0.1", "[*undefined]", "&a 1",
]  # fmt: skip
BYTES = [
    b"\x00", b"\xff", b"\xc3", b"\x80", b"\x1b", b"\x7f", b"\x85", b"\xc2\x85", b"\xe2\x80\xa8",
    b"\xef\xbb\xbf", b"\xed\xa0\x80", b"\t", b"\r", b"\n", b":", b"{", b"}", b"[", b"]", b"&",
    b"*", b"!", b"?", b"-", b"#", b"'", b'"', b"|", b">", b"%", b"@", b" ", b",",
]  # fmt: skip
SNIPPETS = [
    "? [a, b]\n: c", "? {a: 1}\n: c", "? - a\n: c", _bomb(), _bomb(10, 10), "x: &s [*s]",
    "x: &m {<<: *m}", "<<: {replicas: 1000000000}", "x: " + "[" * 500 + "]" * 500,
    "x:\n" + "".join(f"{'  ' * i}- \n" for i in range(1, 200)), "- a", "---\nschema: 1",
    "engine_args: {a: !foo x, b: !!binary aGVsbG8=}", "engine_args: {a: 2024-01-01}",
    "replicas: 1000000000", "gpus_per_replica: 1000000000", "gpus: 1000000000",
    "gpus_per_host: 1000000000", "nodes: 1000000000", "lease_ttl: .inf", "drain_timeout: .inf",
    "1: 1", "~: x", "true: x", "2024-01-01: x", "<<: *undefined", "x: &a 1\ny: &a [*a]",
    "x: !!binary |\n  aGVsbG8=", "%YAML 1.1\n---",
]  # fmt: skip
_VALUE = re.compile(rb"(?<=: )[^,{}\[\]\n#]+")


def mutate(rng: random.Random, data: bytes) -> bytes:
    """``data`` with one to three random mutations."""
    for _ in range(rng.randint(1, 3)):
        data = rng.choice(_MUTATIONS)(rng, data)
    return data


def _replace_value(rng: random.Random, data: bytes) -> bytes:
    spans = [m.span() for m in _VALUE.finditer(data)]
    if not spans:
        return data
    start, end = rng.choice(spans)
    return data[:start] + rng.choice(VALUES).encode() + data[end:]


def _insert_bytes(rng: random.Random, data: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice(BYTES) * rng.choice([1, 1, 2, 50]) + data[at:]


def _insert_snippet(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")
    at = rng.randrange(len(lines) + 1)
    model = lines[at] if at < len(lines) else b""
    indent = b" " * rng.choice([0, len(model) - len(model.lstrip(b" "))])
    snippet = b"\n".join(indent + line for line in rng.choice(SNIPPETS).encode().split(b"\n"))
    return b"\n".join([*lines[:at], snippet, *lines[at:]])


def _shuffle_lines(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    action = rng.choice(["drop", "copy", "swap", "indent", "dedent"])
    if action == "drop":
        del lines[i]
    elif action == "copy":
        lines.insert(j, lines[i])
    elif action == "swap":
        lines[i], lines[j] = lines[j], lines[i]
    elif action == "indent":
        lines[i] = b"  " + lines[i]
    else:
        lines[i] = lines[i][2:] if lines[i].startswith(b"  ") else lines[i]
    return b"\n".join(lines)


def _truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


_MUTATIONS = [*[_replace_value] * 4, *[_insert_bytes] * 2, *[_insert_snippet] * 3]
_MUTATIONS += [_shuffle_lines, _truncate]


def corpus(count: int, seed: int) -> list[tuple[str, bytes]]:
    """``count`` mutated recipes, named after the recipe they come from."""
    rng = random.Random(seed)
    texts = [(path.stem, path.read_bytes()) for path in SEEDS]
    cases = []
    for index in range(count):
        stem, data = texts[index % len(texts)]
        cases.append((f"{index:04d}-{stem}.yaml", mutate(rng, data)))
    return cases
