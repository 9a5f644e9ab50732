"""Stored responses: what ``previous_response_id`` continues and ``GET`` returns.

In the frontend's memory, least recently stored first out once ``max_stored`` is
reached (docs/api.md, "Responses"): a restart, or another frontend process or host,
does not have them, and a missing one is a 404 naming ``previous_response_id``, never a
silent fresh start."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class Stored:
    response: dict[str, Any]
    """The response object as it was answered."""
    conversation: list[dict[str, Any]]
    """The chat messages it ended: the input it continued (without its instructions,
    which are not carried over) and its output."""


class ResponseStore:
    def __init__(self, max_stored: int) -> None:
        self.max_stored = max_stored
        self._kept: OrderedDict[str, Stored] = OrderedDict()

    def put(self, stored: Stored) -> None:
        if self.max_stored <= 0:
            return
        self._kept[stored.response["id"]] = stored
        while len(self._kept) > self.max_stored:
            self._kept.popitem(last=False)

    def get(self, response_id: str) -> Stored | None:
        return self._kept.get(response_id)

    def delete(self, response_id: str) -> bool:
        return self._kept.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._kept)
