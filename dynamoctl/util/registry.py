"""Things by name, in one style: engines, launchers, routing modes, routings, probes,
per-engine plan rules. A registry knows what it holds (``what``, for messages), refuses a
name registered twice, lists its names in order, and answers an unknown name with an
error that lists the valid ones (of the registry's own exception type)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(KeyError):
    """No entry under that name; the message lists the valid ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Entries of one kind by name."""

    def __init__(self, what: str, error: type[Exception] = UnknownName) -> None:
        self.what = what
        """What an entry is, in messages (``engine``, ``router mode``)."""
        self.error = error
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` as ``name``; the same name twice is a programming error."""
        if name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""
        return lambda entry: self.add(name, entry)

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(self.names())
            raise self.error(f"unknown {self.what} {name!r}; valid: {valid}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def copy(self) -> Registry[T]:
        """A registry with the same entries (tests register throwaway ones in it)."""
        other = Registry[T](self.what, self.error)
        other._entries = dict(self._entries)
        return other

    def names(self) -> list[str]:
        """The names, in the order they were registered."""
        return list(self._entries)
