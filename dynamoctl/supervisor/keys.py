"""``dynamoctl keys reload`` through the supervisor: a reload asked of every frontend in
discovery (``{ns}/keys/ask``), and their answers gathered (``frontend/tenants/reload.py``
answers). Each frontend reads its own key file, on its own host."""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec

from dynamoctl.discovery import keys
from dynamoctl.discovery.registry import store_from_url
from dynamoctl.wire.records import Component, InstanceRecord, decode_json
from dynamoctl.wire.tenants import KeyReloadAnswer, KeyReloadAsk, KeysReloadReport

POLL = 0.1
"""Seconds between looks at the answers."""


async def reload_keys(discovery_url: str, namespace: str, timeout: float) -> KeysReloadReport:
    """Ask every frontend to read its key file again; their answers, and the frontends
    registered that did not answer within ``timeout`` seconds."""
    store = store_from_url(discovery_url)
    ask = KeyReloadAsk(id=uuid.uuid4().hex)
    try:
        await store.put(keys.key_reload_ask_key(namespace), msgspec.json.encode(ask))
        deadline = time.monotonic() + timeout
        while True:
            stored = (await store.list(keys.namespace_prefix(namespace))).items
            frontends = _frontends(stored, namespace)
            answers = [
                a
                for a in _answers(stored, namespace)
                if a.ask == ask.id and a.instance_id in frontends
            ]
            answered = {a.instance_id for a in answers}
            silent = sorted(label for id_, label in frontends.items() if id_ not in answered)
            if not silent or time.monotonic() >= deadline:
                answers.sort(key=lambda a: a.label or a.instance_id)
                return KeysReloadReport(answers=answers, silent=silent)
            await asyncio.sleep(POLL)
    finally:
        await store.close()


def _frontends(stored: dict[str, bytes], namespace: str) -> dict[str, str]:
    """The frontends registered now: their labels by instance id."""
    prefix = keys.instances_prefix(namespace, Component.FRONTEND)
    found: dict[str, str] = {}
    for key, value in stored.items():
        if key.startswith(prefix):
            try:
                record = decode_json(value, InstanceRecord)
            except msgspec.DecodeError:
                continue
            found[record.instance_id] = record.label or record.instance_id
    return found


def _answers(stored: dict[str, bytes], namespace: str) -> list[KeyReloadAnswer]:
    prefix = keys.key_reload_answers_prefix(namespace)
    found = []
    for key, value in stored.items():
        if key.startswith(prefix):
            try:
                found.append(msgspec.json.decode(value, type=KeyReloadAnswer))
            except msgspec.DecodeError:
                continue
    return found
