"""Options declared once: a pydantic model per group of knobs, from which a component's
command-line flags, the command line the plan renders and the recipe fields derive.

A field's name, type, default, bounds and docstring are the whole declaration:

- :func:`with_options` adds a model's fields to a typer command: :func:`cli_parameters`
  turns them into typer options (``--field-name``, or
  the name in the model's ``FLAGS``), with the docstring's first sentence as help and the
  bounds as ``min``/``max``; :func:`from_cli` builds the model back from what typer parsed
  and turns a refused value into a usage error naming the flag.
- :func:`to_argv` renders a model as those flags, for the plan (``up --dry-run``).
- Recipe sections subclass the same models, so ``docs/recipes.md`` shows the same
  docstrings and defaults.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal, TypeVar, get_args, get_origin

import annotated_types
import typer
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound="Options")


class Options(BaseModel):
    """A group of knobs; strict (a recipe's ``"2"`` is not 2), unknown keys refused."""

    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)
    FLAGS: ClassVar[dict[str, str]] = {}
    """Field name → flag name where the flag is not the field's name in kebab case."""


def flag(model: type[Options], name: str) -> str:
    """The flag of field ``name`` (a ``FLAGS`` entry of any class it inherits, or kebab case)."""
    for cls in model.__mro__:
        named = vars(cls).get("FLAGS", {})
        if name in named:
            return "--" + str(named[name])
    return "--" + name.replace("_", "-")


def _cli_type(annotation: Any) -> tuple[Any, str]:
    """The type typer parses, and the choices to list in the help (a ``Literal``)."""
    if get_origin(annotation) is Literal:
        return str, " (" + ", ".join(map(str, get_args(annotation))) + ")"
    if get_origin(annotation) in (types.UnionType, typing.Union):
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        parsed, choices = _cli_type(inner[0])
        return parsed | None, choices
    return annotation, ""


def _help(description: str | None) -> str:
    text = " ".join((description or "").replace("``", "").split())
    return text.split(". ")[0].rstrip(".") + "." if text else ""


def cli_parameters(*models: type[Options]) -> list[inspect.Parameter]:
    """Keyword parameters (typer options) for every field of ``models``, in order."""
    params = []
    for model in models:
        for name, info in model.model_fields.items():
            kind, choices = _cli_type(info.annotation)
            bounds: dict[str, Any] = {}
            for rule in info.metadata:
                if isinstance(rule, annotated_types.Ge):
                    bounds["min"] = rule.ge
                elif isinstance(rule, annotated_types.Le):
                    bounds["max"] = rule.le
            default = info.get_default(call_default_factory=True)
            option = typer.Option(
                default, flag(model, name), help=_help(info.description) + choices, **bounds
            )
            params.append(
                inspect.Parameter(
                    name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind
                )
            )
    return params


def from_cli(model: type[M], values: dict[str, Any]) -> M:
    """``model`` from parsed CLI values (only its own fields are taken)."""
    try:
        return model(**{k: v for k, v in values.items() if k in model.model_fields})
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else ""
        hint = flag(model, name) if name in model.model_fields else None
        raise typer.BadParameter(error["msg"], param_hint=hint) from None


def with_options(command: Callable[..., None], **groups: type[Options]) -> Callable[..., None]:
    """``command`` with the flags of ``groups`` added to its own options; it is called with
    each group built (``name=Model(...)``) in place of those flags."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name not in groups]
    names = {p.name for p in own}

    @functools.wraps(command)
    def wrapper(*args: Any, **values: Any) -> None:
        built = {name: from_cli(model, values) for name, model in groups.items()}
        command(*args, **{k: v for k, v in values.items() if k in names}, **built)

    params = own + cli_parameters(*groups.values())
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {}  # typer reads the signature's annotations, not these
    return wrapper


def to_argv(options: Options, only: Iterable[str] | None = None) -> list[str]:
    """``options`` as command-line flags (all fields, or those named in ``only``), in
    declaration order; ``None`` values are left out (the component's default applies)."""
    model = type(options)
    names = list(model.model_fields) if only is None else list(only)
    argv = []
    for name in names:
        value = getattr(options, name)
        if value is None:
            continue
        argv += [flag(model, name), str(value)]
    return argv
