"""Reading the recipe models' own type annotations, for error messages and generated docs."""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation admits: ``A | B | None`` → ``[A, B]``."""
    if get_origin(annotation) in (Union, types.UnionType, Annotated):
        return [model for arg in get_args(annotation) for model in models_in(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def literals_in(annotation: Any) -> list[Any]:
    """The values a ``Literal`` in the annotation allows, e.g. the valid engine names."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType, Annotated):
        return [value for arg in get_args(annotation) for value in literals_in(arg)]
    return []


def union_tag(model: type[BaseModel], union: FieldInfo) -> Any:
    """The tag that selects ``model`` in the discriminated-union field ``union``."""
    return literals_in(model.model_fields[str(union.discriminator)].annotation)[0]


def choices(field: FieldInfo) -> list[Any]:
    """A field's valid values: its Literal's, or for a discriminated union the tags."""
    if field.discriminator is not None:
        return [union_tag(model, field) for model in models_in(field.annotation)]
    return literals_in(field.annotation)
