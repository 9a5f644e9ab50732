"""The frontend's keys at run time: who a request is (its key's entry), whether its
limits let it in, the ``x-ratelimit-*`` headers of its answer, and the key file read again
when it changes (docs/security.md, "The key file").

What a request is admitted as travels with it in :data:`CURRENT` (a context variable: the
request's own task and every task it starts see it), so that the generation pipeline counts
its tokens, checks its context and queues it in its class without a parameter threaded
through every handler.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dynamoctl.frontend.auth import OPEN_PATHS, ApiKeys
from dynamoctl.frontend.errors import OpenAIError, bad_request, invalid_api_key
from dynamoctl.frontend.tenants.limits import KeyLimiter, context_exceeded
from dynamoctl.frontend.tenants.metrics import KeyMetrics
from dynamoctl.frontend.tenants.shared import SharedLimits
from dynamoctl.settings.frontend import ApiKeySettings
from dynamoctl.settings.keyfile import DEFAULT_CLASS, KeyEntry
from dynamoctl.wire.tenants import KeyChanges

log = logging.getLogger(__name__)

CLASS_HEADER = b"x-dynamoctl-class"
"""A request's priority class, when its key's ``allowed_classes`` allows it."""

RELOAD_POLL = 1.0
"""Seconds between looks at the key file's size, time and inode."""

UNLIMITED_PATHS = frozenset({"/v1/messages/count_tokens"})
"""POSTs under ``/v1/`` that generate nothing: not counted against a key's limits."""

Refuse = Callable[[Scope, Receive, Send, OpenAIError], Awaitable[None]]


@dataclass
class Ticket:
    """What a request was admitted as: its key, its class and that class's weight and
    headroom."""

    limiter: KeyLimiter
    class_name: str
    weight: float
    metrics: KeyMetrics
    headroom: float = 0.0
    """The last fraction of the busy thresholds its class may not fill (router)."""
    generation: int = 0
    """Its limiter's generation when admitted (:meth:`check`)."""
    priority: int = 0
    """Its class's engine priority (:attr:`GenerateRequest.priority`)."""

    @property
    def key_name(self) -> str:
        return self.limiter.entry.name

    def start(self, prompt_tokens: int, max_tokens: int) -> None:
        """A choice starts: refuse it past the key's context, count its prompt."""
        refused = context_exceeded(self.limiter.entry, prompt_tokens, max_tokens)
        if refused is not None:
            self.metrics.limited.labels(self.key_name, "context").inc()
            raise refused
        self.limiter.spend(prompt_tokens)
        self.metrics.tokens.labels(self.key_name, "prompt").inc(prompt_tokens)

    def check(self) -> None:
        """Raise the 401 of a key revoked (or given a new secret) since this request was
        admitted: a request still waiting for a worker does not start (streams already
        running finish)."""
        if self.limiter.generation != self.generation:
            raise invalid_api_key(
                f"API key '{self.key_name}' was revoked while this request waited for a worker."
            )

    def finish(self, completion_tokens: int) -> None:
        self.limiter.spend(completion_tokens)
        self.metrics.tokens.labels(self.key_name, "completion").inc(completion_tokens)


CURRENT: ContextVar[Ticket | None] = ContextVar("dynamoctl_ticket", default=None)
"""The ticket of the request being served; None without API keys."""


def current_headroom() -> float:
    """The busy thresholds' fraction the request being served may not fill (a picker's
    ``headroom``); 0 without API keys."""
    ticket = CURRENT.get()
    return 0.0 if ticket is None else ticket.headroom


class Tenants:
    """The keys of the key file (and variable), their limits, and the reloads."""

    def __init__(
        self,
        settings: ApiKeySettings,
        registry: CollectorRegistry,
        shared: SharedLimits | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = KeyMetrics(registry)
        self.shared = shared
        """Limits held for the deployment, with the other frontends; None: per process."""
        self.limiters: dict[str, KeyLimiter] = {}
        self.weights: dict[str, float] = {}
        self.headrooms: dict[str, float] = {}
        self.priorities: dict[str, int] = {}
        self.on_reload: Callable[[], None] | None = None
        """Called after each reload that changed the keys (the admission queue wakes its
        waiters, so that those of a revoked key leave)."""
        self.keys, _ = self._read()
        self._seen = self._stamp()

    def _read(self) -> tuple[ApiKeys, KeyChanges]:
        """Read the keys; a limiter is kept across readings by the key's name."""
        keyfile = self.settings.load_key_file()
        keys = ApiKeys(keyfile.keys)
        self.weights = keyfile.class_weights()
        self.headrooms = keyfile.class_headrooms()
        self.priorities = keyfile.class_priorities()
        limiters: dict[str, KeyLimiter] = {}
        added = changed = 0
        for entry in keyfile.keys:
            if (limiter := self.limiters.get(entry.name)) is not None:
                if limiter.entry.digest() != entry.digest():  # a new secret: the old is revoked
                    limiter.generation += 1
                changed += limiter.entry != entry
                limiter.update(entry)
            else:
                limiter = KeyLimiter(entry, granted=self.shared is not None)
                added += 1
            limiters[entry.name] = limiter
        for name, gone in self.limiters.items():
            if name not in limiters:
                gone.generation += 1
        revoked = sum(name not in limiters for name in self.limiters)
        self.limiters = limiters
        return keys, KeyChanges(keys=len(limiters), added=added, changed=changed, revoked=revoked)

    def queued(self, class_name: str, change: int) -> None:
        """A class's waiting requests changed by ``change`` (the admission queue's hook)."""
        self.metrics.queued.labels(class_name).inc(change)

    def reload(self) -> KeyChanges | str:
        """Read the key file again: what changed, or why the file was refused (logged; the
        keys stay as they were)."""
        self._seen = self._stamp()
        try:
            self.keys, changes = self._read()
        except ValueError as exc:
            self.metrics.reloads.labels("error").inc()
            log.error("API key file not reloaded, the previous keys stay: %s", exc)
            return str(exc)
        self.metrics.reloads.labels("ok").inc()
        log.info(
            "API key file reloaded: %d keys (%d added, %d changed, %d revoked)",
            changes.keys, changes.added, changes.changed, changes.revoked,
        )  # fmt: skip
        if self.on_reload is not None:
            self.on_reload()
        return changes

    def _stamp(self) -> tuple[int, int, int] | None:
        if self.settings.api_keys_file is None:
            return None
        try:
            st = os.stat(self.settings.api_keys_file)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    async def watch(self) -> None:
        """Reload whenever the file's time, size or inode changes (an editor's rename
        included); runs until cancelled."""
        while self.settings.api_keys_file is not None:
            await asyncio.sleep(RELOAD_POLL)
            stamp = self._stamp()
            if stamp != self._seen and stamp is not None:
                self.reload()

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, app: ASGIApp, refuse: Refuse
    ) -> None:
        """Serve one HTTP request: the key checked, its limits applied (generation only),
        its ticket current while ``app`` answers, the rate-limit headers on the answer."""
        if scope["path"] in OPEN_PATHS:
            return await app(scope, receive, send)
        found = self.keys.identify(scope["headers"])
        if isinstance(found, OpenAIError):
            return await refuse(scope, receive, send, found)
        if (
            scope["method"] != "POST"
            or not scope["path"].startswith("/v1/")
            or (scope["path"] in UNLIMITED_PATHS)
        ):
            return await app(scope, receive, send)
        limiter = self.limiters[found.name]
        class_name = _class_of(found, scope["headers"])
        if isinstance(class_name, OpenAIError):
            return await refuse(scope, receive, send, class_name)
        shared = self.shared
        refused = await shared.admit(limiter) if shared and limiter.shared else limiter.admit()
        if refused is not None:
            limit, error = refused
            self.metrics.limited.labels(found.name, limit).inc()
            return await refuse(scope, receive, send, error)
        ticket = Ticket(
            limiter, class_name, self.weights[class_name], self.metrics,
            self.headrooms[class_name], limiter.generation, self.priorities[class_name],
        )  # fmt: skip
        self.metrics.requests.labels(found.name, class_name).inc()
        self.metrics.in_flight.labels(found.name).inc()
        token = CURRENT.set(ticket)
        try:
            await app(scope, receive, _with_headers(send, limiter))
        finally:
            CURRENT.reset(token)
            limiter.release()
            if shared is not None:
                shared.finished(limiter)
            self.metrics.in_flight.labels(found.name).dec()


def _class_of(entry: KeyEntry, headers: list[tuple[bytes, bytes]]) -> str | OpenAIError:
    """The class the request asks for in :data:`CLASS_HEADER`, if its key allows it."""
    for name, value in headers:
        if name == CLASS_HEADER:
            wanted = value.decode("latin-1").strip()
            if wanted == entry.class_ or wanted in entry.allowed_classes:
                return wanted
            allowed = ", ".join([entry.class_, *entry.allowed_classes])
            return bad_request(
                f"This key may not ask for class '{wanted}' (allowed: {allowed}).",
                param=CLASS_HEADER.decode(),
            )
    return entry.class_ or DEFAULT_CLASS


def _with_headers(send: Send, limiter: KeyLimiter) -> Send:
    """``send`` adding the key's ``x-ratelimit-*`` headers to the response's start."""
    if limiter.requests is None and limiter.tokens is None:
        return send

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", []), *limiter.headers()]
        await send(message)

    return sending
