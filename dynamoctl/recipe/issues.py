"""What the recipe loader reports: one :class:`Issue` per problem, raised together."""

from __future__ import annotations

from dataclasses import dataclass

FieldPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Issue:
    """One problem in a recipe file."""

    file: str
    """The file as the user named it."""
    line: int | None
    """1-based line, or None when the problem is not in the text (unreadable file)."""
    path: str
    """Dotted field path, e.g. ``workers.decode.replicas``; empty for file-level problems."""
    message: str
    column: int | None = None
    """1-based column, where the problem is one spot of the text (YAML syntax, a tag, a
    character) rather than a field's value."""

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        text = f"{where} {self.path}: {self.message}" if self.path else f"{where}: {self.message}"
        # One issue, one line, whatever a key or a YAML parser's message quotes.
        return text.replace("\r", "\\r").replace("\n", "\\n")


class RecipeError(Exception):
    """A recipe that cannot be used; ``issues`` lists every problem found, by line."""

    def __init__(self, issues: list[Issue]) -> None:
        self.issues = issues
        super().__init__("\n".join(map(str, issues)))


def dotted(path: FieldPath) -> str:
    """``("workers", "agg", "env")`` → ``workers.agg.env``; list items as ``[i]``."""
    return "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path)[1:]
