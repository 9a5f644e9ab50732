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
from collections.abc import Callable, Iterable, Iterator
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
    SHORT: ClassVar[dict[str, str]] = {}
    """Field name → a short flag it also has (``-n``)."""
    NOT_FLAGS: ClassVar[frozenset[str]] = frozenset()
    """Fields that are not flags (set by the command from something else)."""


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
    return _literal(text.split(". ")[0].rstrip(".") + ".") if text else ""


def _literal(text: str) -> str:
    """``text`` as typed in ``--help``. Typer renders help as rich markup, which reads
    ``:A:`` or ``:M:`` as emoji codes (``uniform:A:B`` showed as ``uniform🅰B``) and has no
    escape for them; an empty tag after each colon splits every such code and renders as
    nothing, not even an ANSI code."""
    if typer.core.DEFAULT_MARKUP_MODE != "rich":  # TYPER_USE_RICH=0: plain click help
        return text
    return text.replace(":", ":[bold][/bold]")


def _nested(info: Any) -> type[Options] | None:
    """The group a field holds, when it holds one (its flags are flattened in)."""
    kind = info.annotation
    return kind if isinstance(kind, type) and issubclass(kind, Options) else None


def _flags(model: type[Options]) -> list[tuple[type[Options], str, Any]]:
    """(declaring model, field, info) of every flag of ``model``, nested groups flattened."""
    found: list[tuple[type[Options], str, Any]] = []
    for name, info in model.model_fields.items():
        if name in model.NOT_FLAGS:
            continue
        group = _nested(info)
        found += _flags(group) if group is not None else [(model, name, info)]
    return found


def cli_parameters(*models: type[Options]) -> list[inspect.Parameter]:
    """Keyword parameters (typer options) for every flag of ``models``, in order."""
    params = []
    for model in models:
        for owner, name, info in _flags(model):
            kind, choices = _cli_type(info.annotation)
            bounds: dict[str, Any] = {}
            for rule in info.metadata:
                if isinstance(rule, annotated_types.Ge):
                    bounds["min"] = rule.ge
                elif isinstance(rule, annotated_types.Le):
                    bounds["max"] = rule.le
            default = info.get_default(call_default_factory=True)
            names = [flag(owner, name), *([owner.SHORT[name]] if name in owner.SHORT else [])]
            option = typer.Option(default, *names, help=_help(info.description) + choices, **bounds)
            params.append(
                inspect.Parameter(
                    name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind
                )
            )
    return params


def _build(model: type[M], values: dict[str, Any]) -> M:
    fields = {}
    for name, info in model.model_fields.items():
        group = _nested(info)
        if group is not None:
            fields[name] = _build(group, values)
        elif name in values:
            fields[name] = values[name]
    return model(**fields)


def from_cli(model: type[M], values: dict[str, Any]) -> M:
    """``model`` (its nested groups too) from parsed CLI values."""
    try:
        return _build(model, values)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else ""
        owner = next((m for m, n, _ in _flags(model) if n == name), None)
        hint = flag(owner, name) if owner is not None else None
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


def to_argv(
    options: Options, only: Iterable[str] | None = None, *, explicit: bool = False
) -> list[str]:
    """``options`` as command-line flags, in declaration order, nested groups flattened:
    every flag, those whose field is named in ``only``, or (``explicit``) those that were
    given when ``options`` was made. ``None`` values are left out (the component's default
    applies); a ``bool`` field is a flag that is off by default, given bare when true."""
    wanted = None if only is None else set(only)
    argv = []
    for owner, name, value in _values(options, explicit):
        if value is None or (wanted is not None and name not in wanted) or value is False:
            continue
        argv += [flag(owner, name)] if value is True else [flag(owner, name), str(value)]
    return argv


def _values(options: Options, explicit: bool) -> Iterator[tuple[type[Options], str, Any]]:
    model = type(options)
    for name, info in model.model_fields.items():
        if name in model.NOT_FLAGS or (explicit and name not in options.model_fields_set):
            continue
        if _nested(info) is not None:
            yield from _values(getattr(options, name), explicit)
        else:
            yield model, name, getattr(options, name)
