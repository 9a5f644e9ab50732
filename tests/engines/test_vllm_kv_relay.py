"""vLLM's own KV event publisher, bound node-local (``ipc://``, the recipe switch of
docs/security.md, "The engines' KV event streams"), carried onto the deployment's CURVE
event plane by the worker's relay (``dynamoctl/planes/events/relay.py``): a subscriber
with the deployment's key reads every batch, in order, the ones published before it
joined through the relayed replay; a subscriber in the clear reads nothing. The
publisher is vLLM's ``ZmqEventPublisher`` itself, not a copy of its framing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import zmq

from dynamoctl.planes.curve import generate_secret
from dynamoctl.planes.events import Event, EventSubscriber
from dynamoctl.planes.events.relay import KvEventRelay, node_local
from dynamoctl.security.names import CURVE_SECRET_KEY
from dynamoctl.wire.kv_events import decode_batch
from tests.engines.vllm_required import require

if TYPE_CHECKING:
    from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher

require("vllm")
# vLLM is imported where it is used, not at collection: importing it cost each
# pytest-xdist worker seconds of a 2-core machine for one test on one worker. The fixture
# that imports it now runs under the timeout: it took over 120 s at load 14.
pytestmark = pytest.mark.timeout(300)

TOPIC = "kv"


@pytest.fixture
def vllm_publisher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ZmqEventPublisher]:
    from vllm.distributed.kv_events import ZmqEventPublisher

    monkeypatch.setenv(CURVE_SECRET_KEY, generate_secret())
    publisher = ZmqEventPublisher(
        data_parallel_rank=0,
        endpoint=f"ipc://{tmp_path}/kv.pub",
        replay_endpoint=f"ipc://{tmp_path}/kv.replay",
        topic=TOPIC,
    )
    try:
        yield publisher
    finally:
        publisher.shutdown()


def batch(block: int) -> KVEventBatch:
    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    stored = BlockStored(
        block_hashes=[block], parent_block_hash=None, token_ids=list(range(16)),
        block_size=16, lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip
    return KVEventBatch(ts=time.time(), events=[stored], data_parallel_rank=0)


async def test_vllms_node_local_stream_is_relayed_under_curve_only(
    vllm_publisher: ZmqEventPublisher, tmp_path: Path
) -> None:
    engine_pub, engine_replay = f"ipc://{tmp_path}/kv.pub", f"ipc://{tmp_path}/kv.replay"
    assert node_local(engine_pub) and node_local("tcp://127.0.0.1:5557")
    assert not node_local("tcp://10.0.0.5:5557") and not node_local("tcp://*:5557")
    relay = KvEventRelay(engine_pub, engine_replay, "127.0.0.1")
    address, replay = await relay.start()
    assert replay is not None
    try:
        for block in range(3):  # before anyone subscribes: only a replay brings them
            vllm_publisher.publish(batch(block))
        await asyncio.sleep(0.5)
        plain = zmq.Context.instance().socket(zmq.SUB)  # no key: the handshake fails
        plain.setsockopt(zmq.SUBSCRIBE, b"")
        plain.setsockopt(zmq.LINGER, 0)
        plain.connect(address)
        async with EventSubscriber(idle_poll=0.1) as sub:
            await sub.add_publisher("vllm-worker", address, replay, curve=True)
            await asyncio.sleep(0.5)
            for block in range(3, 6):
                vllm_publisher.publish(batch(block))
            items = [await asyncio.wait_for(sub.get(), 10) for _ in range(6)]
        events = [item for item in items if isinstance(item, Event)]
        assert [e.seq for e in events] == list(range(6)), items
        stored = [decode_batch(e.payload).events[0] for e in events]
        assert [s.block_hashes for s in stored] == [[b] for b in range(6)]  # type: ignore[union-attr]
        assert plain.poll(1000) == 0  # nothing reached the subscriber without the key
        plain.close()
    finally:
        await relay.close()
