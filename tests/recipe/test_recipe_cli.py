"""``dynamoctl`` command line: version, recipe commands, and the not-yet-implemented ones."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dynamoctl import __version__
from dynamoctl.cli import app
from dynamoctl.recipe import Recipe, load_recipe, load_recipe_text

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted(str(path.relative_to(REPO)) for path in (REPO / "recipes").glob("*.yaml"))
BROKEN = "schema: 1\nname: demo\nmodel: {name: m, path: p}\nworkers:\n  decode:\n    replicas: -1\n"

runner = CliRunner()


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    return path


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert (result.exit_code, result.stdout) == (0, f"dynamoctl {__version__}\n")


def test_validate_shipped_recipes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    result = runner.invoke(app, ["recipe", "validate", *RECIPES])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"ok  {path}" for path in RECIPES]
    assert result.stderr == ""


def test_validate_reports_every_issue_on_stderr_and_exits_1(broken: Path) -> None:
    good = REPO / "recipes" / "local.yaml"
    result = runner.invoke(app, ["recipe", "validate", str(broken), str(good)])
    assert result.exit_code == 1
    assert result.stdout == f"ok  {good}\n"
    assert result.stderr.splitlines() == [
        f"{broken}:5 workers.decode.engine: missing required field",
        f"{broken}:6 workers.decode.replicas: must be >= 0, got -1",
    ]


def test_validate_missing_file_exits_1(tmp_path: Path) -> None:
    result = runner.invoke(app, ["recipe", "validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 1
    assert "cannot read" in result.stderr


@pytest.mark.parametrize("as_json", [False, True], ids=["yaml", "json"])
def test_show_output_loads_back_into_the_same_recipe(as_json: bool) -> None:
    path = REPO / "recipes" / "llama70b-disagg.yaml"
    result = runner.invoke(app, ["recipe", "show", str(path), *(["--json"] if as_json else [])])
    assert result.exit_code == 0, result.output
    shown = (
        Recipe.model_validate(json.loads(result.stdout))
        if as_json
        else load_recipe_text(result.stdout, "shown.yaml")
    )
    assert shown == load_recipe(path)


def test_show_fills_defaults_in_schema_order() -> None:
    result = runner.invoke(app, ["recipe", "show", str(REPO / "recipes" / "local.yaml")])
    top_level_keys = [line.split(":")[0] for line in result.stdout.splitlines() if line[0] != " "]
    assert top_level_keys == [
        "schema", "name", "namespace", "discovery", "target", "model", "frontend", "workers",
        "supervision", "security",
    ]  # fmt: skip
    assert "  lease_ttl: 10.0\n" in result.stdout


def test_show_invalid_recipe_exits_1(broken: Path) -> None:
    result = runner.invoke(app, ["recipe", "show", str(broken)])
    assert (result.exit_code, result.stdout) == (1, "")
    assert "workers.decode.replicas: must be >= 0, got -1" in result.stderr


def test_schema_is_json_schema_with_field_descriptions() -> None:
    result = runner.invoke(app, ["recipe", "schema"])
    schema = json.loads(result.stdout)
    assert schema["required"] == ["schema", "name", "model", "workers"]
    assert schema["$defs"]["WorkerPool"]["properties"]["replicas"]["description"]


# --- the real entry points, in a child process ---------------------------------------------


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_python_dash_m(broken: Path) -> None:
    ok = run(sys.executable, "-m", "dynamoctl", "recipe", "validate", *RECIPES)
    assert (ok.returncode, ok.stderr) == (0, "")
    bad = run(sys.executable, "-m", "dynamoctl", "recipe", "validate", str(broken))
    assert bad.returncode == 1
    assert f"{broken}:6 workers.decode.replicas: must be >= 0, got -1" in bad.stderr
    usage = run(sys.executable, "-m", "dynamoctl", "router", "--router-mode", "nope")
    assert usage.returncode == 2
    assert "Invalid value for --router-mode" in usage.stderr


def test_installed_console_script() -> None:
    beside_python = Path(sys.executable).with_name("dynamoctl")
    script = str(beside_python) if beside_python.exists() else shutil.which("dynamoctl")
    assert script, "the package is installed without its console script"
    result = run(script, "--version")
    assert (result.returncode, result.stdout) == (0, f"dynamoctl {__version__}\n")


def test_every_package_directory_is_a_package() -> None:
    """setuptools' find_packages skips folders without __init__.py: a wheel would lack them."""
    import dynamoctl

    root = Path(dynamoctl.__file__).parent
    missing = [
        str(d.relative_to(root))
        for d in root.rglob("*")
        if d.is_dir() and any(d.glob("*.py")) and not (d / "__init__.py").exists()
    ]
    assert missing == []
