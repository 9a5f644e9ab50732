"""Hostile recipes: what YAML allows but a recipe must not hold (tags, complex keys, dates,
control characters, bytes that are not UTF-8, huge numbers) and what would crash or stall
the loader (deep nesting, recursive aliases, alias bombs) are refused with the file, the
line, the column and the field, quickly; the command line prints them one per line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from dynamoctl.recipe import RecipeError, load_recipe, load_recipe_text
from dynamoctl.recipe.guard import MAX_BYTES, MAX_DEPTH, MAX_VALUES

REPO = Path(__file__).resolve().parents[2]
HEAD = "schema: 1\nname: demo\nmodel: {name: m, path: org/m}\n"  # lines 1-3
AGG = "workers:\n  agg:\n    engine: mocker\n    gpus_per_replica: 0\n"  # lines 4-7


def issues(text: str) -> list[str]:
    with pytest.raises(RecipeError) as caught:
        load_recipe_text(text, "bad.yaml")
    return [str(issue) for issue in caught.value.issues]


def engine_args(value: str) -> str:
    """A valid recipe but for ``engine_args``, on line 8, column 18."""
    return HEAD + AGG + f"    engine_args: {value}\n"


# --- structure: depth, recursion, alias bombs ---------------------------------------------


def test_deep_nesting_is_refused_where_it_gets_too_deep() -> None:
    assert issues(engine_args("[" * 500 + "]" * 500)) == [
        f"bad.yaml:8:{18 + MAX_DEPTH - 3} workers.agg.engine_args[0]: "
        f"nested more than {MAX_DEPTH} levels deep"
    ]
    block = HEAD + "x:\n" + "".join(f"{'  ' * i}a:\n" for i in range(1, 200))
    [issue] = issues(block)
    assert issue.startswith(f"bad.yaml:{4 + MAX_DEPTH}:{2 * MAX_DEPTH + 1} x.a.a.a: nested")
    # Nesting up to the bound is fine (engine_args is a mapping at depth 3).
    deep = "{a: " * (MAX_DEPTH - 3) + "1" + "}" * (MAX_DEPTH - 3)
    assert load_recipe_text(engine_args(deep), "ok.yaml").workers.agg is not None


@pytest.mark.parametrize(
    ("value", "column", "field"),
    [("&s [*s]", 22, "[0]"), ("&m {a: *m}", 25, ".a"), ("&m {<<: *m}", 26, ".<<")],
    ids=["list", "mapping", "merge"],
)
def test_an_alias_inside_its_own_anchor_is_refused(value: str, column: int, field: str) -> None:
    alias = value.split("*")[1].rstrip("]}")
    assert issues(engine_args(value)) == [
        f"bad.yaml:8:{column} workers.agg.engine_args{field}: "
        f"alias *{alias} is inside its own anchor (a recursion)"
    ]


def bomb(levels: int, width: int = 9) -> str:
    lines = [f"x-b0: &b0 [{', '.join(['lol'] * width)}]"]
    lines += [f"x-b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_once() -> None:
    text = bomb(levels=9) + HEAD + AGG  # 609 bytes that expand to 9**9 values
    started = time.perf_counter()
    assert issues(text) == [
        f"bad.yaml:5:12 x-b4[0]: more than {MAX_VALUES} keys and values once aliases are expanded"
    ]
    assert time.perf_counter() - started < 0.5  # was 34 s for 9**8, 5 min for 9**9
    # Aliases that expand to a sensible size still work.
    pools = (
        "workers:\n"
        "  prefill: {engine: mocker, gpus_per_replica: 0, engine_args: &args {max-num-seqs: 8}}\n"
        "  decode: {engine: mocker, gpus_per_replica: 0, engine_args: *args}\n"
    )
    decode = load_recipe_text(HEAD + pools, "ok.yaml").workers.decode
    assert decode is not None and decode.engine_args == {"max-num-seqs": 8}


def test_a_redefined_anchor_is_no_warning() -> None:
    text = HEAD + AGG + "    engine_args: {a: &x 1, b: &x 2, c: *x}\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ruamel's ReusedAnchorWarning printed 6 lines
        loaded = load_recipe_text(text, "ok.yaml")
    assert loaded.workers.agg is not None and loaded.workers.agg.engine_args["c"] == 2


# --- values: tags, keys, dates, characters ---------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("!foo x", "!foo"),
        ("!foo {a: 1}", "!foo"),
        ("!!binary aGVsbG8=", "!!binary"),
        ("!!set {a}", "!!set"),
        ("!!omap [a: 1]", "!!omap"),
        ("!!timestamp 2001-12-14", "!!timestamp"),
        ("!!python/object/apply:os.system [true]", "!!python/object/apply:os.system"),
        ("!!str 1", "!!str"),
        ("! x", "!"),
    ],
)
def test_tags_are_refused_with_their_column(value: str, shown: str) -> None:
    assert issues(engine_args(f"{{a: {value}}}")) == [
        f"bad.yaml:8:22 workers.agg.engine_args.a: YAML tag {shown} is not allowed: "
        "a recipe holds only plain values (quote a string)"
    ]


def test_every_tag_is_reported_at_once() -> None:
    text = HEAD.replace("name: demo", "name: !n demo") + AGG + "    env: {A: !!str 1}\n"
    assert [issue.split(" YAML")[0] for issue in issues(text)] == [
        "bad.yaml:2:7 name:",
        "bad.yaml:8:14 workers.agg.env.A:",
    ]


@pytest.mark.parametrize("key", ["? [a, b]\n      : c", "? {a: 1}\n      : c"])
def test_complex_keys_are_refused(key: str) -> None:
    assert issues(engine_args("\n      " + key)) == [
        "bad.yaml:9:9 workers.agg.engine_args: "
        "a key must be a plain string, not a mapping or a list"
    ]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("1", "got 1; quote it: '1'"),
        ("true", "got true; quote it: 'true'"),
        ("~", "got null; quote it"),
        ("2024-01-01", "got 2024-01-01; quote it: '2024-01-01'"),
    ],
)
def test_keys_that_are_not_strings_are_refused(key: str, message: str) -> None:
    assert issues(HEAD + AGG + f"    env: {{{key}: x}}\n") == [
        f"bad.yaml:8:11 workers.agg.env: a key must be a string, {message}"
    ]
    assert issues(f"{key}: x\n" + HEAD + AGG) == [
        f"bad.yaml:1:1: a key must be a string, {message}"
    ]


def test_dates_are_refused_in_engine_args() -> None:
    # They passed validation, then the dry run crashed rendering them as JSON.
    assert issues(engine_args("{a: 2024-01-01, b: 2001-12-14t21:59:43.10-05:00}")) == [
        "bad.yaml:8:22 workers.agg.engine_args.a: 2024-01-01 is read as a date; "
        "quote it to make it a string",
        "bad.yaml:8:37 workers.agg.engine_args.b: 2001-12-14T21:59:43.100000-05:00 is read "
        "as a date; quote it to make it a string",
    ]


@pytest.mark.parametrize(
    ("char", "name"), [("\x00", "U+0000 (NUL)"), ("\x1b", "U+001B (ESC)"), ("\x7f", "U+007F (DEL)")]
)
def test_control_characters_in_the_text_name_line_column_and_field(char: str, name: str) -> None:
    assert issues(HEAD + AGG.replace("mocker", f"mo{char}cker")) == [
        f"bad.yaml:6:15 workers.agg.engine: character {name} is not allowed in YAML; remove it"
    ]
    assert issues(HEAD + AGG.replace("engine", f"en{char}gine")) == [
        f"bad.yaml:6:7 workers.agg: character {name} is not allowed in YAML; remove it"
    ]


@pytest.mark.parametrize(
    ("escape", "name"), [("\\0", "U+0000 (NUL)"), ("\\e", "U+001B (ESC)"), ("\\ud800", "U+D800")]
)
def test_control_characters_from_escapes_are_refused(escape: str, name: str) -> None:
    assert issues(HEAD + AGG + f'    env: {{A: "x{escape}"}}\n') == [
        f"bad.yaml:8:14 workers.agg.env.A: contains the character {name}; remove it"
    ]


def test_a_key_with_a_newline_is_reported_on_one_line() -> None:
    [issue] = issues(HEAD + AGG + '    "repli\\ncas": 2\n')
    assert issue == (
        "bad.yaml:8 workers.agg.repli\\ncas: unknown field 'repli\\ncas' (did you mean 'replicas'?)"
    )


def test_bytes_that_are_not_utf8_name_line_column_and_field(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes((HEAD + AGG + "    env: {GREETING: 'caf\xe9 ok'}\n").encode("latin-1"))
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert str(caught.value) == (
        f"{path}:8:25 workers.agg.env.GREETING: not UTF-8: byte 0xe9 (invalid continuation "
        "byte); save the file as UTF-8"
    )


def test_a_file_larger_than_a_recipe_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(HEAD + AGG + "#" * MAX_BYTES + "\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert str(caught.value) == f"{path}: larger than 256 KiB; a recipe is a short file"


# --- numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "issue"),
    [
        (HEAD + AGG + "    replicas: 1000000000\n", "8 workers.agg.replicas: must be <= 1024"),
        (
            HEAD + AGG.replace(": 0", ": 1000000000"),
            "7 workers.agg.gpus_per_replica: must be <= 4096",
        ),
        (HEAD + "target: {kind: local, gpus: 100000}\n" + AGG, "4 target.gpus: must be <= 64"),
        (
            HEAD + "target: {kind: ssh, hosts: [a], gpus_per_host: 65}\n" + AGG,
            "4 target.gpus_per_host: must be <= 64",
        ),
        (
            HEAD + "discovery: {backend: etcd, managed: true}\n"
            "target: {kind: slurm, partition: p, nodes: 100000, gpus_per_node: 0}\n" + AGG,
            "5 target.nodes: must be <= 1024",
        ),
        (HEAD + "frontend: {router: {replicas: 65}}\n" + AGG, "4 frontend.router.replicas:"),
        (
            HEAD + "discovery: {backend: embedded, lease_ttl: .inf}\n" + AGG,
            "4 discovery.lease_ttl:",
        ),
        (HEAD + "supervision: {drain_timeout: .inf}\n" + AGG, "4 supervision.drain_timeout:"),
        (HEAD + "supervision: {hang_timeout: 1e300}\n" + AGG, "4 supervision.hang_timeout:"),
    ],
    ids=[
        "replicas",
        "gpus_per_replica",
        "gpus",
        "gpus_per_host",
        "nodes",
        "router",
        "lease_ttl",
        "drain_timeout",
        "hang_timeout",
    ],
)
def test_numbers_are_bounded(text: str, issue: str) -> None:
    [found] = issues(text)
    assert found.startswith(f"bad.yaml:{issue}")


# --- the command line: exit 1, one line per issue, no traceback, no hang --------------------


BAD = {
    "deep.yaml": engine_args("[" * 500 + "]" * 500).encode(),
    "tag.yaml": engine_args("{a: !foo x, b: !!binary aGVsbG8=}").encode(),
    "bomb.yaml": (bomb(levels=9) + HEAD + AGG).encode(),
    "nul.yaml": (HEAD + AGG.replace("mocker", "mo\x00cker")).encode(),
    "latin1.yaml": (HEAD + AGG + "    env: {A: 'caf\xe9'}\n").encode("latin-1"),
    "replicas.yaml": (HEAD + AGG + "    replicas: 1000000000\n").encode(),
    "complex.yaml": engine_args("\n      ? [a, b]\n      : c").encode(),
    "recursive.yaml": engine_args("&m {<<: *m}").encode(),
}


@pytest.fixture
def bad_files(tmp_path: Path) -> list[Path]:
    for name, data in BAD.items():
        (tmp_path / name).write_bytes(data)
    return [tmp_path / name for name in BAD]


def dynamoctl(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DYNAMOCTL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "dynamoctl", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line_per_issue(stderr: str, files: list[Path]) -> None:
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert {line.split(":")[0] for line in lines} == {str(path) for path in files}
    for line in lines:
        assert re.fullmatch(r"[^:]+:\d+(:\d+)?( \S+)?: \S.*", line), line


def test_validate_reports_every_bad_file_on_one_line_each(bad_files: list[Path]) -> None:
    result = dynamoctl("recipe", "validate", *map(str, bad_files), home=bad_files[0].parent)
    assert (result.returncode, result.stdout) == (1, "")
    assert_one_line_per_issue(result.stderr, bad_files)


def test_dry_run_refuses_each_bad_file_in_one_line(bad_files: list[Path]) -> None:
    for path in (bad_files[1], bad_files[2], bad_files[5]):  # tag, alias bomb, replicas
        result = dynamoctl("up", str(path), "--dry-run", home=path.parent / "home")
        assert (result.returncode, result.stdout) == (1, ""), result.stderr
        assert_one_line_per_issue(result.stderr, [path])
