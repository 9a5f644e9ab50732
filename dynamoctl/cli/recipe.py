"""``dynamoctl recipe``: check recipes and show them as dynamoctl reads them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import typer
from ruamel.yaml import YAML

from dynamoctl.recipe import Recipe, RecipeError, load_recipe

recipe_app = typer.Typer(no_args_is_help=True, help="Validate and inspect recipe files.")


def register(app: typer.Typer) -> None:
    app.add_typer(recipe_app, name="recipe")


@recipe_app.command()
def validate(
    files: list[Path] = typer.Argument(..., help="Recipe files to check.", show_default=False),
) -> None:
    """Check recipe files; print every problem as FILE:LINE[:COLUMN] field: message.

    Exits 1 if any file is invalid.
    """
    invalid = 0
    for file in files:
        try:
            load_recipe(file)
        except RecipeError as exc:
            invalid += 1
            for issue in exc.issues:
                typer.echo(str(issue), err=True)
        else:
            typer.echo(f"ok  {file}")
    if invalid:
        raise typer.Exit(1)


@recipe_app.command()
def show(
    file: Path = typer.Argument(..., help="Recipe file.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of YAML."),
) -> None:
    """Print a recipe with every default filled in, as dynamoctl will use it."""
    try:
        recipe = load_recipe(file)
    except RecipeError as exc:
        for issue in exc.issues:
            typer.echo(str(issue), err=True)
        raise typer.Exit(1) from None
    typer.echo(dump_json(recipe) if as_json else dump_yaml(recipe), nl=False)


@recipe_app.command()
def schema() -> None:
    """Print the recipe JSON Schema (for editors, e.g. yaml-language-server)."""
    typer.echo(json.dumps(Recipe.model_json_schema(by_alias=True), indent=2))


def normalised(recipe: Recipe) -> dict[str, object]:
    """The recipe as plain data, defaults included, unset optional fields left out.

    Key order is the schema's field order, so the output is deterministic.
    """
    return recipe.model_dump(mode="json", by_alias=True, exclude_none=True)


def dump_json(recipe: Recipe) -> str:
    return json.dumps(normalised(recipe), indent=2) + "\n"


def dump_yaml(recipe: Recipe) -> str:
    out = io.StringIO()
    YAML(typ="rt").dump(normalised(recipe), out)  # round-trip dumper: keeps key order
    return out.getvalue()
