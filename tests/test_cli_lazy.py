"""A ``dynamoctl`` process imports only the command group it runs (``dynamoctl.cli``): the
supervisor starts every component as a ``dynamoctl`` command, and each start paid for all
twelve groups' imports."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import typer.main

from dynamoctl.cli import GROUPS, build_app, groups_for


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_each_group_registers_the_commands_its_entry_names(group: str) -> None:
    command = typer.main.get_command(build_app([group]))
    assert isinstance(command, typer.main.TyperGroup)
    assert sorted(command.commands) == sorted(GROUPS[group])


def test_the_whole_app_has_every_command_once() -> None:
    command = typer.main.get_command(build_app())
    assert isinstance(command, typer.main.TyperGroup)
    named = [name for names in GROUPS.values() for name in names]
    assert sorted(command.commands) == sorted(named)
    assert len(set(named)) == len(named)


def test_a_command_line_without_a_known_command_gets_every_group() -> None:
    assert groups_for(["--help"]) == tuple(GROUPS)
    assert groups_for(["nonsense"]) == tuple(GROUPS)
    assert groups_for(["--version"]) == tuple(GROUPS)
    assert groups_for(["lb-config", "x.yaml"]) == ("deploy",)


_IMPORTED = """
import sys
sys.argv = ["dynamoctl", *sys.argv[1:]]
from dynamoctl.cli import main
try:
    main()
except SystemExit:
    pass
print(" ".join(name for name in sys.modules if name.startswith("dynamoctl.")))
"""


@pytest.mark.parametrize("command", ["worker", "follower", "frontend", "router", "planner", "up"])
def test_a_component_command_imports_no_other_group(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _IMPORTED, command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    imported = set(out.split())
    own = next(group for group, commands in GROUPS.items() if command in commands)
    assert f"dynamoctl.cli.{own}" in imported
    others = {f"dynamoctl.cli.{group}" for group in GROUPS if group != own}
    assert imported & others == set()
    assert "dynamoctl.configure.options" not in imported  # AI Configurator's option set
    assert "dynamoctl.bench.options" not in imported


_MODULES = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(" ".join(sys.modules))
"""

_HEAVY = {"numpy", "aetcd", "grpc", "fastapi"}
"""Libraries a process imports only when it uses them: numpy (the planner's fits, the
mocker's embedding table), the etcd client (etcd discovery), ~0.1-0.15 s a start each;
and FastAPI, which none uses (the frontend's ``/openapi.json`` is built from its route
table, dynamoctl/frontend/openapi.py)."""


@pytest.mark.parametrize("command", ["status", "down", "drain", "scale", "logs"])
def test_an_operator_command_starts_without_the_recipe_models_or_the_etcd_client(
    command: str,
) -> None:
    """`status` and `down` of a running deployment read its state file and ask its
    supervisor: no recipe parsing, no plan building, no etcd."""
    out = subprocess.run(
        [sys.executable, "-c", _IMPORTED, command, "--help"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    imported = set(out.split())
    assert imported & {"dynamoctl.recipe.models", "dynamoctl.plan.build"} == set()
    assert "dynamoctl.supervisor.rundir" in imported  # the state file's reader is there


@pytest.mark.parametrize(
    "modules",
    [
        ["dynamoctl.frontend.main"],
        ["dynamoctl.worker.main", "dynamoctl.engines.mocker.engine"],
        ["dynamoctl.cli.operate", "dynamoctl.supervisor.rundir"],
    ],
    ids=["frontend", "mocker-worker", "status"],
)
def test_a_process_imports_numpy_and_the_etcd_client_only_when_it_uses_them(
    modules: list[str],
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _MODULES, *modules],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert set(out.split()) & _HEAVY == set()


def test_every_settings_name_resolves_from_the_module_it_is_listed_under() -> None:
    """`dynamoctl.settings` imports each name on first use from the module ``_WHERE``
    names; ``__all__`` (what type checkers read) and ``_WHERE`` list the same names."""
    import dynamoctl.settings as settings

    where = settings._WHERE
    assert sorted(where) == sorted(settings.__all__)
    for name, module in where.items():
        assert getattr(settings, name) is getattr(
            importlib.import_module(f"dynamoctl.settings.{module}"), name
        ), name
