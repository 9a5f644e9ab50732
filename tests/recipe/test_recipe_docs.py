"""docs/recipes.md stays true: its field reference matches the models, its examples load."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from dynamoctl.recipe import load_recipe_text
from dynamoctl.recipe.introspect import models_in
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.reference import BEGIN, END, REGENERATE, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
TEXT = DOC.read_text(encoding="utf-8")
EXAMPLES = re.findall(r"```yaml\n(.*?)```", TEXT, flags=re.DOTALL)


def test_field_reference_is_up_to_date() -> None:
    start, end = TEXT.index(BEGIN), TEXT.index(END) + len(END)
    assert TEXT[start:end] == render(), (
        f"docs/recipes.md is out of date with the models in dynamoctl/recipe/; run: {REGENERATE}"
    )


def test_field_reference_documents_every_field() -> None:
    reference = render()
    for model in _models(Recipe):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
            assert f"| `{field.alias or name}` |" in reference


def test_every_target_kind_has_an_example() -> None:
    kinds = {load_recipe_text(text, "docs/recipes.md").target.kind for text in EXAMPLES}
    assert kinds == {"local", "ssh", "slurm"}


@pytest.mark.parametrize("text", EXAMPLES)
def test_example_is_a_valid_recipe(text: str) -> None:
    load_recipe_text(text, "docs/recipes.md")


def _models(model: type[BaseModel]) -> set[type[BaseModel]]:
    """Every model reachable from ``model`` through its fields' annotations."""
    found = {model}
    for field in model.model_fields.values():
        for member in models_in(field.annotation):
            found |= _models(member)
    return found
