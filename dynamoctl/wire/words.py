"""The base of the wire's string enumerations (states, phases, component and endpoint
names)."""

from __future__ import annotations

import enum


class Word(str, enum.Enum):
    """A ``str`` whose ``str()``, ``%s`` and f-string form is its value (``READY``, not
    ``State.READY``), so log lines, tables and keys show what the wire carries."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
