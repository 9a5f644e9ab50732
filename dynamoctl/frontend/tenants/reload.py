"""``dynamoctl keys reload`` at a frontend: the supervisor writes a reload asked for
(``{ns}/keys/ask``) in discovery; every frontend process watching it reads its key file
again and answers under its own lease what changed, in counts, or why the file was
refused (the previous keys then stay). See docs/security.md, "The key file"."""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

import msgspec

from dynamoctl.discovery import keys
from dynamoctl.discovery.api import EventKind
from dynamoctl.discovery.client import Discovery
from dynamoctl.frontend.tenants.service import Tenants
from dynamoctl.wire.tenants import KeyReloadAnswer, KeyReloadAsk

log = logging.getLogger(__name__)


def background(
    tenants: Tenants, discovery: Discovery, namespace: str, instance_id: str, label: str
) -> list[Coroutine[Any, Any, None]]:
    """What a frontend with keys runs beside serving: the key file watched, the reloads
    asked through discovery answered, the shared limits' slots renewed."""
    found = [tenants.watch(), follow_reloads(tenants, discovery, namespace, instance_id, label)]
    if tenants.shared is not None:
        found.append(tenants.shared.renew())
    return found


async def follow_reloads(
    tenants: Tenants, discovery: Discovery, namespace: str, instance_id: str, label: str
) -> None:
    """Answer every reload asked while this frontend runs (one asked before it started is
    answered too: its keys were read at start, so it reports them unchanged); runs until
    cancelled."""
    answered = ""
    async for event in discovery.watch(keys.key_reload_ask_key(namespace)):
        if event.kind is not EventKind.PUT or event.value is None:
            continue
        try:
            ask = msgspec.json.decode(event.value, type=KeyReloadAsk)
        except msgspec.DecodeError:
            log.warning("a key reload asked in a form this frontend does not read; ignored")
            continue
        if ask.id == answered:
            continue
        answered = ask.id
        result = tenants.reload()
        answer = KeyReloadAnswer(
            ask=ask.id,
            instance_id=instance_id,
            label=label,
            changes=None if isinstance(result, str) else result,
            error=result if isinstance(result, str) else "",
        )
        await discovery.register(
            keys.key_reload_answer_key(namespace, instance_id), msgspec.json.encode(answer)
        )
