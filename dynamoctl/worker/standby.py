"""A warm spare's wait for promotion (``dynamoctl worker --standby``, recipe ``spares``).

The spare's instances start as any worker's do, engine ready, but register a standby record
(:attr:`~dynamoctl.worker.instance.WorkerInstance.standby_key`) instead of the records
routers read. The supervisor promotes one by writing its promotion key
(:func:`dynamoctl.discovery.keys.promote_key`); the instance then registers as a worker,
which is what makes it READY: no engine start, only a few discovery writes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from dynamoctl.discovery import Discovery, keys
from dynamoctl.discovery.api import EventKind
from dynamoctl.worker.instance import WorkerInstance

log = logging.getLogger(__name__)


async def promote_when_asked(
    discovery: Discovery, namespace: str, instances: Sequence[WorkerInstance]
) -> None:
    """Promote each standby instance once its promotion key appears; returns when none
    is left on standby (cancelled with the process otherwise)."""
    waiting = {
        keys.promote_key(namespace, inst.instance_id): inst for inst in instances if inst.standby
    }
    if not waiting:
        return
    async for event in discovery.watch(keys.promotions_prefix(namespace)):
        inst = waiting.pop(event.key, None) if event.kind is EventKind.PUT else None
        if inst is None:
            continue
        began = time.monotonic()
        await inst.promote()
        log.info(
            "[%s] promoted: serving (%.3f s after the request)",
            inst.instance_id,
            time.monotonic() - began,
        )
        if not waiting:
            return
