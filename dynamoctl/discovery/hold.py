"""Stale-while-unavailable: deletions held back while discovery is settling.

When etcd freezes or is lost for longer than a lease TTL, every lease expires at once when
it comes back, and every worker's keys vanish until its keepalive notices and writes them
again (a second or two). A consumer that believed those deletions would stop serving
workers that never stopped answering. So a watch with ``hold`` (docs/discovery.md,
"Stale while unavailable") keeps a deletion back while discovery is *settling*
(unreachable, or it came back or a lease was lost within the last lease TTL):

* the key's re-registration (a PUT) ends the hold: the consumer sees the PUT, an upsert;
* ``alive(key)`` saying False (checked every :data:`CHECK_INTERVAL`) lets the deletion
  through at once: a held worker that died is dropped within about a second;
* otherwise the deletion goes through ``hold_for`` seconds (about a lease TTL) after it
  arrived.

Deletions while discovery is settled (a drain, a lease that expired on its own) are
never held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

from dynamoctl.discovery.api import EventKind, WatchEvent

log = logging.getLogger(__name__)

AliveCheck = Callable[[str], Awaitable[bool]]
"""Whether what a held key describes still answers (False: drop it now)."""

CHECK_INTERVAL = 1.0
"""Seconds between two liveness checks of the held keys."""


async def hold_deletes(
    events: AsyncGenerator[WatchEvent, None],
    settling: Callable[[], bool],
    hold_for: float,
    alive: AliveCheck | None = None,
) -> AsyncGenerator[WatchEvent, None]:
    """``events``, with deletions that arrive while ``settling()`` held back (module doc)."""
    held: dict[str, float] = {}  # key -> when its deletion goes through
    pending: asyncio.Task[WatchEvent | None] | None = None
    next_check = 0.0
    try:
        while True:
            if pending is None:
                pending = asyncio.create_task(_next(events), name="discovery-watch-next")
            wake = min([*held.values(), next_check]) if held else None
            timeout = None if wake is None else max(0.0, wake - time.monotonic())
            done, _ = await asyncio.wait({pending}, timeout=timeout)
            if done:
                event, pending = pending.result(), None
                if event is None:
                    return  # the events ended
                if event.kind is EventKind.DELETE and settling():
                    if not held:  # one line per episode: there may be hundreds of keys
                        log.info(
                            "discovery settling: deletions held for up to %.0fs (%s, ...)",
                            hold_for,
                            event.key,
                        )
                    held.setdefault(event.key, time.monotonic() + hold_for)
                    continue
                if held.pop(event.key, None) is not None and event.kind is EventKind.PUT:
                    log.debug("%s registered again while held", event.key)
                yield event
                continue
            now = time.monotonic()
            expired = [key for key, until in held.items() if until <= now]
            if alive is not None and now >= next_check:
                next_check = now + CHECK_INTERVAL
                expired += [k for k in held if k not in expired and not await _answers(alive, k)]
            for key in expired:
                if held.pop(key, None) is not None:
                    log.debug("held deletion of %s released", key)
                    yield WatchEvent(EventKind.DELETE, key)
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await events.aclose()


async def _next(events: AsyncIterator[WatchEvent]) -> WatchEvent | None:
    try:
        return await events.__anext__()
    except StopAsyncIteration:
        return None


async def _answers(alive: AliveCheck, key: str) -> bool:
    try:
        return await alive(key)
    except Exception:  # a check that fails says nothing: the hold's deadline decides
        log.debug("liveness check of %s failed", key, exc_info=True)
        return True


async def address_answers(address: str, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at ``address`` (``tcp://HOST:PORT`` or
    ``http://HOST:PORT/...``): a process killed or gone refuses at once. Answers True when
    the address says nothing checkable (the hold's deadline then decides)."""
    parts = urlsplit(address)
    if parts.hostname is None or parts.port is None:
        return True
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port), timeout
        )
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
