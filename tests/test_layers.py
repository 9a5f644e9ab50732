"""The import rules of docs/architecture.md ("Layers"), checked on the source.

The graph is read with :mod:`ast`, not by importing: every ``import`` statement of a module
counts, at module level, inside a function (a lazy import still runs in that process) and
under ``if TYPE_CHECKING:`` (a type named is a dependency on its owner's design). A
component process's modules are everything its entry module reaches through that graph.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dynamoctl"

COMPONENT_ENTRIES = {
    "planner": "dynamoctl.planner.main",
    "frontend": "dynamoctl.frontend.main",
    "router": "dynamoctl.router.standalone.main",
    "worker": "dynamoctl.worker.main",
    "follower": "dynamoctl.worker.follower",
}
"""Each component process and the module it starts from (what its ``dynamoctl`` subcommand
runs)."""

ORCHESTRATION = ("dynamoctl.supervisor", "dynamoctl.launch")
"""What only the supervisor and the operator commands run; no component process imports it."""

FOUNDATION = ("dynamoctl.util", "dynamoctl.wire")
"""The ground floor: ``util`` imports nothing of the project, ``wire`` only ``wire`` and
``util``."""

FORBIDDEN = (
    ("dynamoctl.supervisor", "dynamoctl.launch.slurm"),
    ("dynamoctl.structured", "dynamoctl.frontend"),
)
"""(importer, imported) packages that must not meet: the supervisor imports nothing of
Slurm (it asks its launcher for extra capacity through ``launch/capacity.py``), and
structured outputs know no HTTP (``structured/errors.py``)."""

EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()
"""(importer, imported) arrows that break a rule on purpose."""

CIRCLE_EXCEPTIONS: tuple[frozenset[str], ...] = ()
"""Circles left on purpose. With :data:`EXCEPTIONS`, at most four, each named with its
reason in docs/architecture.md, "Layers"."""

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(tree: ast.AST, package: str) -> Iterator[str]:
    """Every name an import statement in ``tree`` asks for, as ``module`` or
    ``module.attribute`` (the caller finds which is a module)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            yield from (f"{source}.{alias.name}" for alias in node.names)


@cache
def import_graph() -> Mapping[str, frozenset[str]]:
    """module -> the project modules it imports."""
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = {owner(n) for n in _imported(ast.parse(path.read_text()), package)}
        graph[name] = frozenset(t for t in targets if t is not None and t != name)
    return graph


def reached(entry: str, graph: Mapping[str, Iterable[str]]) -> set[str]:
    seen, todo = {entry}, [entry]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = stack[stack.index(node) :]
                    del stack[stack.index(node) :]
                    if len(group) > 1:
                        found.append(sorted(group))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in stack:
                low[node] = min(low[node], index[target])
    return found


def _within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def breaches(graph: Mapping[str, Iterable[str]]) -> set[tuple[str, str]]:
    """Every (importer, imported) arrow against the rules, exceptions included."""
    found = set()
    for module, targets in graph.items():
        for target in targets:
            if _within(module, ["dynamoctl.util"]) and not _within(target, ["dynamoctl.util"]):
                found.add((module, target))
            if _within(module, ["dynamoctl.wire"]) and not _within(target, FOUNDATION):
                found.add((module, target))
            if any(_within(module, [a]) and _within(target, [b]) for a, b in FORBIDDEN):
                found.add((module, target))
            if _is_engine_spec(module) and not _spec_may_import(target):
                found.add((module, target))
    for entry in COMPONENT_ENTRIES.values():
        closure = reached(entry, graph)
        for module in closure:
            for target in graph[module]:
                if _within(target, ORCHESTRATION) and not _within(module, ORCHESTRATION):
                    found.add((module, target))
    return found


def _is_engine_spec(module: str) -> bool:
    parts = module.split(".")
    return parts[:2] == ["dynamoctl", "engines"] and parts[-1] == "spec"


def _spec_may_import(target: str) -> bool:
    """An engine spec holds plain values: it may import ``wire``, ``settings``, ``util`` and
    other specs, never an engine's adapter nor a recipe, plan or configure model."""
    return _within(target, [*FOUNDATION, "dynamoctl.settings"]) or _is_engine_spec(target)


def test_no_module_imports_one_that_imports_it_back() -> None:
    found = [frozenset(group) for group in circles(import_graph())]
    assert [sorted(group) for group in found if group not in CIRCLE_EXCEPTIONS] == []
    assert [sorted(c) for c in CIRCLE_EXCEPTIONS if c not in found] == [], "no longer needed"


def test_the_layer_rules_hold_but_for_the_named_exceptions() -> None:
    assert sorted(breaches(import_graph()) - EXCEPTIONS) == []
    assert sorted(EXCEPTIONS - breaches(import_graph())) == [], "an exception no longer needed"


def test_the_exceptions_are_few_and_each_has_its_reason_in_the_docs() -> None:
    assert len(EXCEPTIONS) + len(CIRCLE_EXCEPTIONS) <= 4
    layers = ARCHITECTURE.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    named = [
        *(a for arrow in EXCEPTIONS for a in arrow),
        *(m for c in CIRCLE_EXCEPTIONS for m in c),
    ]
    for module in named:
        path = module.removeprefix("dynamoctl.").replace(".", "/") + ".py"
        assert f"`{path}`" in layers, f"docs/architecture.md, Layers: no reason for {path}"


def test_the_rules_catch_what_they_forbid() -> None:
    graph = {
        "dynamoctl.util.a": frozenset({"dynamoctl.wire.b"}),
        "dynamoctl.wire.b": frozenset({"dynamoctl.util.a"}),
        "dynamoctl.planner.main": frozenset({"dynamoctl.planner.c"}),
        "dynamoctl.planner.c": frozenset({"dynamoctl.launch.d"}),
        "dynamoctl.launch.d": frozenset(),
        "dynamoctl.supervisor.e": frozenset({"dynamoctl.launch.slurm.f"}),
        "dynamoctl.launch.slurm.f": frozenset(),
        "dynamoctl.structured.g": frozenset({"dynamoctl.frontend.h"}),
        "dynamoctl.frontend.h": frozenset(),
        "dynamoctl.engines.x.spec": frozenset({"dynamoctl.engines.x.engine"}),
        "dynamoctl.engines.x.engine": frozenset(),
        "dynamoctl.frontend.main": frozenset(),
        "dynamoctl.router.standalone.main": frozenset(),
        "dynamoctl.worker.main": frozenset(),
        "dynamoctl.worker.follower": frozenset(),
    }
    assert circles(graph) == [["dynamoctl.util.a", "dynamoctl.wire.b"]]
    assert breaches(graph) == {
        ("dynamoctl.util.a", "dynamoctl.wire.b"),
        ("dynamoctl.planner.c", "dynamoctl.launch.d"),
        ("dynamoctl.supervisor.e", "dynamoctl.launch.slurm.f"),
        ("dynamoctl.structured.g", "dynamoctl.frontend.h"),
        ("dynamoctl.engines.x.spec", "dynamoctl.engines.x.engine"),
    }


@pytest.mark.parametrize("component", sorted(COMPONENT_ENTRIES))
def test_a_component_process_loads_no_orchestration_module(component: str) -> None:
    # What really runs, lazy imports done at start-up included: the static graph above can
    # miss an import made by name (importlib), this cannot.
    entry = COMPONENT_ENTRIES[component]
    code = (
        f"import sys, {entry}\n"
        f"print('\\n'.join(m for m in sys.modules if m.startswith({ORCHESTRATION!r})))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert loaded == []
