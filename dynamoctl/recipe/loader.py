"""Load a recipe file and report every problem as ``FILE:LINE field.path: message``.

YAML is parsed with ruamel's round-trip loader, which remembers the line of every key;
pydantic's errors are then mapped back onto those lines, with their messages shortened to
what a person editing the file needs (the knob, the rule, the value that broke it). Before
that, :mod:`.guard` refuses what would crash or stall the parser, and :func:`_plain` what
YAML reads but no recipe field or command line can carry (dates, control characters,
keys that are not strings), each with its line and column.
"""

from __future__ import annotations

import datetime
import difflib
import re
import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, ReusedAnchorWarning, YAMLError

from dynamoctl.recipe import guard
from dynamoctl.recipe.fields import RULE_ERROR
from dynamoctl.recipe.introspect import choices, models_in, union_tag
from dynamoctl.recipe.issues import FieldPath, Issue, RecipeError, dotted
from dynamoctl.recipe.models import SCHEMA_VERSION, Recipe
from dynamoctl.recipe.security import ENV_VALUE_TAGS

__all__ = ["Issue", "RecipeError", "load_recipe", "load_recipe_text"]


def load_recipe(path: str | Path) -> Recipe:
    """Read, parse and validate a recipe file; raise :class:`RecipeError` if it is unusable."""
    try:
        with open(path, "rb") as file:
            data = file.read(guard.MAX_BYTES + 1)  # bounded: a FIFO or /dev/zero ends too
    except OSError as exc:
        raise RecipeError([Issue(str(path), None, "", f"cannot read: {exc.strerror}")]) from exc
    return load_recipe_text(guard.decode(data, str(path)), str(path))


def load_recipe_text(text: str, filename: str) -> Recipe:
    """Parse and validate recipe ``text``; ``filename`` only labels the issues."""
    document = _parse_yaml(text, filename)
    _check_schema_version(document, filename)
    problems: list[_Problem] = []
    data = _plain(document, (), problems)
    if problems:
        raise RecipeError(sorted(_issues(problems, document, filename), key=_order))
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        issues = {
            _to_issue(error, document, filename)
            for error in exc.errors()
            # A field whose default derives from another (namespace ← name) reports that it
            # was skipped when the other is invalid; the other's own error says it all.
            if error["type"] != "default_factory_not_called"
        }
        raise RecipeError(sorted(issues, key=_order)) from exc


def _order(issue: Issue) -> tuple[int, int, str]:
    return issue.line or 0, issue.column or 0, issue.path


def _parse_yaml(text: str, filename: str) -> CommentedMap:
    guard.check_text(text, filename)
    try:
        guard.scan(text, filename)
        with warnings.catch_warnings():
            # A redefined anchor is valid YAML (aliases take the latest); not worth a
            # multi-line warning on stderr.
            warnings.simplefilter("ignore", ReusedAnchorWarning)
            document = YAML(typ="rt").load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.context_mark is not None and exc.problem:
            message += f" ({exc.context} started on line {exc.context_mark.line + 1})"
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        raise RecipeError([Issue(filename, line, "", message, column)]) from exc
    except YAMLError as exc:
        raise RecipeError([Issue(filename, None, "", f"invalid YAML: {exc}")]) from exc
    if document is None:
        raise RecipeError([Issue(filename, 1, "", "empty recipe; start with 'schema: 1'")])
    if not isinstance(document, CommentedMap):
        raise RecipeError(
            [Issue(filename, 1, "", f"a recipe is a mapping of keys, got {_describe(document)}")]
        )
    return document


def _check_schema_version(document: CommentedMap, filename: str) -> None:
    # Checked before anything else: the rest of a file written for another schema is noise.
    if "schema" not in document:
        message = f"missing required field; add 'schema: {SCHEMA_VERSION}' at the top"
        raise RecipeError([Issue(filename, _root_line(document), "schema", message)])
    version = document["schema"]
    if type(version) is not int or version != SCHEMA_VERSION:
        message = (
            f"unsupported recipe schema version {_describe(version)}; "
            f"this dynamoctl reads schema {SCHEMA_VERSION}"
        )
        raise RecipeError([Issue(filename, document.lc.key("schema")[0] + 1, "schema", message)])


# --- ruamel's values → plain Python values ---------------------------------------------------

_Problem = tuple[FieldPath, bool, str]
"""Where a value is wrong (its path; whether the value rather than the key is at fault)
and what is wrong with it."""
_UNCARRIED = re.compile("[\x00-\x08\x0b-\x1f\x7f\ud800-\udfff]")
"""Characters a quoted escape (``"\\0"``) can put in a string that no command line,
environment variable or terminal carries: C0 controls but tab and newline, DEL, and
unpaired surrogates."""


def _plain(node: Any, path: FieldPath, problems: list[_Problem]) -> Any:
    """ruamel's node types as plain Python values (pydantic is strict about subclasses);
    what is not a core-schema value goes to ``problems`` instead."""
    if isinstance(node, dict):
        plain = {}
        for key, value in node.items():
            if not isinstance(key, str):
                problems.append(((*path, key), False, _key_message(key)))
            elif _is_carried(key, (*path, key), False, problems):
                plain[str(key)] = _plain(value, (*path, key), problems)
        return plain
    if isinstance(node, list):
        return [_plain(item, (*path, index), problems) for index, item in enumerate(node)]
    if node is None:
        return None
    for scalar in (bool, int, float, str):  # bool first: it is an int
        if isinstance(node, scalar):
            return scalar(node) if _is_carried(node, path, True, problems) else None
    problems.append((path, True, _not_plain_message(node)))
    return None


def _is_carried(value: Any, path: FieldPath, of_value: bool, problems: list[_Problem]) -> bool:
    bad = _UNCARRIED.search(value) if isinstance(value, str) else None
    if bad is not None:
        message = f"contains the character {guard.char_name(bad[0])}; remove it"
        problems.append((path, of_value, message))
    return bad is None


def _key_message(key: Any) -> str:
    shown = _describe(key)
    quoted = f": '{shown}'" if isinstance(key, (int, float, datetime.date)) else ""
    return f"a key must be a string, got {shown}; quote it{quoted}"


def _not_plain_message(value: Any) -> str:
    if isinstance(value, datetime.date):  # YAML reads 2024-01-01 as a date
        return f"{_describe(value)} is read as a date; quote it to make it a string"
    return f"{_describe(value)} is not a plain YAML value; quote it to make it a string"


def _issues(problems: list[_Problem], document: CommentedMap, filename: str) -> list[Issue]:
    issues = []
    for path, of_value, message in problems:
        line, column = _locate(document, path, of_value)
        # A bad key is quoted in the message, not put in the path: it may not even print.
        shown = path if of_value else path[:-1]
        issues.append(Issue(filename, line, dotted(shown), message, column))
    return issues


# --- pydantic error → Issue -----------------------------------------------------------------


def _to_issue(error: ErrorDetails, document: CommentedMap, filename: str) -> Issue:
    path, owner = _strip_union_tags(error["loc"])
    message = _message(error, path, owner)
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == RULE_ERROR and ctx["at"]:
        path += tuple(ctx["at"].split("."))
    elif kind.startswith("union_tag_"):  # point at the tag key itself, e.g. target.kind
        path += (ctx["discriminator"].strip("'"),)
    return Issue(filename, _line_of(document, path), dotted(path), message)


def _message(error: ErrorDetails, path: FieldPath, owner: type[BaseModel] | None) -> str:
    kind, ctx, value = error["type"], error.get("ctx", {}), error["input"]
    field = str(path[-1]) if path else ""
    if kind == "missing":
        return "missing required field"
    if kind == "extra_forbidden":
        known = list(owner.model_fields) if owner else []
        close = difflib.get_close_matches(field, known, n=1)
        return f"unknown field '{field}'" + (f" (did you mean '{close[0]}'?)" if close else "")
    if kind == "union_tag_not_found":
        return f"missing required field (one of {_choices(owner, path)})"
    if kind == "union_tag_invalid":
        value = ctx["tag"]
        message = f"must be one of {_choices(owner, path)}"
    elif kind == "literal_error":
        message = f"must be one of {_choices(owner, path)}"
    elif kind in _BOUNDS:
        symbol, key = _BOUNDS[kind]
        bound = ctx[key]
        message = f"must be {symbol} {int(bound) if bound == int(bound) else bound}"
    elif kind == "too_short":
        return "must not be empty"
    elif kind in ("value_error", RULE_ERROR):
        message = str(ctx.get("error", error["msg"]))
    else:
        message = _EXPECTED.get(kind) or error["msg"][0].lower() + error["msg"][1:]
    # A mapping or list is only worth naming when the wrong kind of value is the problem.
    if kind == RULE_ERROR or (isinstance(value, (dict, list)) and kind not in _EXPECTED):
        return message
    return f"{message}, got {_describe(value)}"


_BOUNDS = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}
_EXPECTED = {
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "path_type": "expected a path",
}


def _strip_union_tags(loc: tuple[str | int, ...]) -> tuple[FieldPath, type[BaseModel] | None]:
    """Drop the discriminator tags pydantic puts in ``loc`` (``target.ssh.hosts`` →
    ``target.hosts``); also return the model that owns the last field of the path."""
    path: list[str | int] = []
    owner: type[BaseModel] | None = None
    models: list[type[BaseModel]] = [Recipe]  # what the next step is a field of
    union: FieldInfo | None = None  # set when the next step is this union's tag
    for step in loc:
        if union is not None:
            models = [model for model in models if step == union_tag(model, union)]
            union = None
            continue
        if step in ENV_VALUE_TAGS and len(path) >= 2 and path[-2] == "env":
            continue  # the form of a pool's env value (plain or secret), not a field
        owner = models[0] if len(models) == 1 else None
        field = owner.model_fields.get(step) if owner and isinstance(step, str) else None
        models = models_in(field.annotation) if field else []
        union = field if field is not None and field.discriminator is not None else None
        path.append(step)
    return tuple(path), owner


def _choices(owner: type[BaseModel] | None, path: FieldPath) -> str:
    field = owner.model_fields.get(str(path[-1])) if owner and path else None
    return ", ".join(repr(value) for value in choices(field)) if field else "?"


def _line_of(document: CommentedMap, path: FieldPath) -> int:
    """1-based line of the deepest key of ``path`` present in the file: the key itself,
    or for a missing field the key of the mapping that should hold it."""
    return _locate(document, path)[0]


def _locate(
    document: CommentedMap, path: FieldPath, of_value: bool = False
) -> tuple[int, int | None]:
    """Line and column of the deepest key of ``path`` present in the file (of its value,
    with ``of_value``); the column only when the whole path is there."""
    line, node, position = _root_line(document), document, None
    for step in path:
        position = None
        if isinstance(node, (CommentedMap, CommentedSeq)) and node.lc.data:
            # Keys merged in from an anchor (``<<: *x``) have no position of their own.
            position = node.lc.data.get(step)
        if position is None:
            return line, None
        line, node = position[0] + 1, node[step]
    if position is None:
        return line, None
    at = 2 if of_value and len(position) == 4 else 0  # a mapping's: key line, col, value's
    return position[at] + 1, position[at + 1] + 1


def _root_line(document: CommentedMap) -> int:
    return int(document.lc.line) + 1


def _describe(value: Any) -> str:
    """A value as the YAML author wrote it, or the kind of thing it is."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return repr(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__
