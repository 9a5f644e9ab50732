"""What the frontends of one deployment share about API keys in discovery: the key
reloads ``dynamoctl keys reload`` asks for and each frontend's answer, and the budgets of
keys whose limits hold for the whole deployment (docs/security.md, "Limits")."""

from __future__ import annotations

import msgspec


class KeyChanges(msgspec.Struct, frozen=True, kw_only=True):
    """What one reading of the key file changed, in counts (never a key nor a name)."""

    keys: int
    """Keys in force after the reading."""
    added: int = 0
    """Names that were not in force before."""
    changed: int = 0
    """Names whose secret, class or limits changed."""
    revoked: int = 0
    """Names no longer in the file."""


class KeyReloadAsk(msgspec.Struct, frozen=True, kw_only=True):
    """``{ns}/keys/ask``: the latest reload asked of every frontend."""

    id: str
    """Unique per ask: a frontend answers each id once."""


class KeyReloadAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """``{ns}/keys/answers/{instance_id}``: one frontend's reading of its key file."""

    ask: str
    """The :attr:`KeyReloadAsk.id` it answers."""
    instance_id: str
    label: str = ""
    """The supervisor's name for the frontend (``frontend-0``)."""
    changes: KeyChanges | None = None
    """What the reading changed; None when the file was refused."""
    error: str = ""
    """Why the file was refused (``FILE:LINE field: message``); the previous keys stay."""


class KeysReloadReport(msgspec.Struct, frozen=True, kw_only=True):
    """What ``dynamoctl keys reload`` prints: every frontend's answer."""

    answers: list[KeyReloadAnswer]
    silent: list[str] = []
    """Frontends registered in discovery that did not answer in time."""


class KeysReloadRequest(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /keys/reload`` on the supervisor's control endpoint."""

    timeout: float = 10.0
    """Seconds to wait for every frontend's answer."""


class SharedBucket(msgspec.Struct, frozen=True, array_like=True):
    """``{ns}/limits/{name}/requests|tokens``: a key's bucket for the whole deployment,
    from which each frontend process takes grants."""

    level: float
    """What is left; below zero when processes spent more than they were granted."""
    stamp: float
    """Wall-clock time of ``level`` (it refills from there at limit per minute)."""


class SharedSlots(msgspec.Struct, frozen=True, array_like=True):
    """``{ns}/limits/{name}/concurrency``: the slots of a key's ``concurrent_requests``
    each frontend process holds, with the wall-clock time until which the count holds
    unless renewed (a dead process's slots come back then)."""

    held: dict[str, tuple[int, float]]
