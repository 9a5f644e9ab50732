"""Recipe text checked before ruamel builds a tree of it, so that what YAML allows but a
recipe never needs is refused with ``FILE:LINE:COLUMN field: message`` instead of a crash,
a stall, or a value no command line can carry:

- bytes that are not UTF-8, and characters YAML forbids (NUL and other controls);
- a file over :data:`MAX_BYTES`; nesting deeper than :data:`MAX_DEPTH` (ruamel builds the
  tree recursively, and scans deep flow nesting in quadratic time); more than
  :data:`MAX_VALUES` values once aliases are expanded (an alias bomb: 600 bytes that expand
  to 387 million values); an alias inside its own anchor (a structure that contains itself);
- explicit tags, ``!foo``, ``!!binary``, ``!!set``, even ``!!str``: a recipe holds only the
  core schema's plain values (the loader refuses the implicit dates YAML also reads);
- keys that are mappings or lists (``? [a, b]``).

The checks read ruamel's event stream, which its parser produces without recursion, and
stop at the first excess, before any of it is built.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    MappingStartEvent,
    NodeEvent,
    ScalarEvent,
)

from dynamoctl.recipe.issues import FieldPath, Issue, RecipeError, dotted

MAX_BYTES = 256 * 1024
"""Largest recipe file: a hundred times the largest shipped one, yet parsed in well under
a second."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists; recipes need about six levels."""
MAX_VALUES = 10_000
"""Most keys and values in a recipe once aliases are expanded: a recipe for a thousand
hosts, each with its address, has a few thousand."""

_YAML_FORBIDDEN = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""Characters the YAML 1.2 spec (and ruamel's reader) refuses anywhere in a stream."""
_LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")  # what ruamel counts as a new line


def decode(data: bytes, filename: str) -> str:
    """The text of a recipe file: UTF-8, within :data:`MAX_BYTES`."""
    if len(data) > MAX_BYTES:
        raise RecipeError([Issue(filename, None, "", _too_large())])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        prefix = data[: exc.start].decode("utf-8")  # everything before the first bad byte
        line, column = _line_column(prefix, len(prefix))
        readable = data.decode("utf-8", errors="replace")  # the bad byte becomes U+FFFD
        message = f"not UTF-8: byte 0x{data[exc.start]:02x} ({exc.reason}); save the file as UTF-8"
        path = _path_at(readable, len(prefix))
        raise RecipeError([Issue(filename, line, path, message, column)]) from None


def check_text(text: str, filename: str) -> None:
    """Refuse text too large for a recipe or holding characters YAML forbids."""
    if len(text) > MAX_BYTES:
        raise RecipeError([Issue(filename, None, "", _too_large())])
    bad = _YAML_FORBIDDEN.search(text)
    if bad is not None:
        line, column = _line_column(text, bad.start())
        message = f"character {char_name(bad[0])} is not allowed in YAML; remove it"
        readable = _YAML_FORBIDDEN.sub("\ufffd", text)  # parseable, to name the field
        path = _path_at(readable, bad.start())
        raise RecipeError([Issue(filename, line, path, message, column)])


def char_name(char: str) -> str:
    """``U+0000 (NUL)``: how a character that cannot be shown is named."""
    names = {0: "NUL", 0x1B: "ESC", 0x7F: "DEL"}
    code = ord(char)
    return f"U+{code:04X}" + (f" ({names[code]})" if code in names else "")


def _line_column(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of ``text[index]``, lines broken where ruamel breaks them."""
    breaks = list(_LINE_BREAK.finditer(text, 0, index))
    start = breaks[-1].end() if breaks else 0
    return len(breaks) + 1, index - start + 1


def _too_large() -> str:
    return f"larger than {MAX_BYTES // 1024} KiB; a recipe is a short file"


# --- the event stream -----------------------------------------------------------------------


@dataclass
class _Open:
    """A mapping or list whose end event has not come yet."""

    path: FieldPath
    mapping: bool
    anchor: str | None
    first_value: int = 0
    """Values counted before it opened (its expanded size is the difference at its end)."""
    items: int = 0
    """Nodes seen in it so far: in a mapping, keys and values alternate."""
    key: str = ""


def _walk(text: str) -> Iterator[tuple[Any, FieldPath, bool, list[_Open]]]:
    """Each node event and each collection's end, with its field path, whether it is a
    mapping key, and the collections open around it (its own included, for a collection's
    start and end)."""
    stack: list[_Open] = []
    for event in YAML(typ="rt").parse(text):
        if isinstance(event, CollectionEndEvent):
            yield event, stack[-1].path, False, stack
            stack.pop()
            _count_item(stack)
        elif isinstance(event, NodeEvent):  # not stream or document boundaries
            path, is_key = _place(event, stack[-1] if stack else None)
            if isinstance(event, CollectionStartEvent):
                stack.append(_Open(path, isinstance(event, MappingStartEvent), event.anchor))
                yield event, path, is_key, stack
            else:
                yield event, path, is_key, stack
                _count_item(stack)


def _place(event: Any, parent: _Open | None) -> tuple[FieldPath, bool]:
    """The field path of a node and whether it is a mapping key (a key names itself; a
    complex one, its mapping)."""
    if parent is None:
        return (), False
    if not parent.mapping:
        return (*parent.path, parent.items), False
    if parent.items % 2:
        return (*parent.path, parent.key), False
    name = event.value if isinstance(event, ScalarEvent) else None
    parent.key = "?" if name is None else name
    return (parent.path if name is None else (*parent.path, name)), True


def _count_item(stack: list[_Open]) -> None:
    if stack:
        stack[-1].items += 1


def scan(text: str, filename: str) -> None:
    """Refuse deep nesting, alias bombs, recursive aliases, tags and complex keys.

    Raises :class:`RecipeError`, or ruamel's ``MarkedYAMLError`` for a syntax error."""
    values = 0
    sizes: dict[str, int] = {}  # anchor → values its node expands to
    tags: list[Issue] = []
    for event, path, is_key, stack in _walk(text):
        if isinstance(event, CollectionEndEvent):
            if stack[-1].anchor is not None:
                sizes[stack[-1].anchor] = values - stack[-1].first_value
            continue
        problem = None
        if getattr(event, "tag", None) is not None:
            tags.append(_issue(filename, event, path, _tag_message(str(event.tag))))
        if is_key and not isinstance(event, ScalarEvent) and not _scalar_alias(event, sizes):
            problem = "a key must be a plain string, not a mapping or a list"
        elif isinstance(event, AliasEvent):
            if any(open_.anchor == event.anchor for open_ in stack):
                problem = f"alias *{event.anchor} is inside its own anchor (a recursion)"
            values += sizes.get(event.anchor, 1)  # an unknown anchor: ruamel reports it
        else:
            values += 1
        if problem is None and values > MAX_VALUES:
            problem = f"more than {MAX_VALUES} keys and values once aliases are expanded"
        if isinstance(event, CollectionStartEvent):
            stack[-1].first_value = values - 1
            if problem is None and len(stack) > MAX_DEPTH:
                problem = f"nested more than {MAX_DEPTH} levels deep"
                path = path[:4]  # the field it starts in; the line and column say where
        if problem is not None:
            raise RecipeError([*tags, _issue(filename, event, path, problem)])
    if tags:
        raise RecipeError(tags)


def _issue(filename: str, event: Any, path: FieldPath, message: str) -> Issue:
    mark = event.start_mark
    return Issue(filename, mark.line + 1, dotted(path), message, mark.column + 1)


def _scalar_alias(event: Any, sizes: dict[str, int]) -> bool:
    """An alias of a scalar, which is a fine key (a collection's expands to more)."""
    return isinstance(event, AliasEvent) and sizes.get(event.anchor, 1) == 1


def _tag_message(tag: str) -> str:
    core = "tag:yaml.org,2002:"  # how ruamel spells the !! shorthand
    shown = tag.replace(core, "!!", 1) if tag.startswith(core) else tag
    return f"YAML tag {shown} is not allowed: a recipe holds only plain values (quote a string)"


def _path_at(text: str, index: int) -> str:
    """Best effort: the field whose text holds ``text[index]``, a bad character replaced
    by U+FFFD; empty when the text does not parse, or the spot is outside every value."""
    found: FieldPath = ()
    try:
        for count, (event, path, _, stack) in enumerate(_walk(text)):
            if event.start_mark.index > index or count > MAX_VALUES or len(stack) > MAX_DEPTH:
                break  # past the spot, or where the walk itself would get slow
            found = path[:-1] if isinstance(event, CollectionEndEvent) else path
    except YAMLError:
        pass
    # A key that holds the character is no name for it: stop before it.
    cut = next((i for i, step in enumerate(found) if "\ufffd" in str(step)), len(found))
    return dotted(found[:cut])
