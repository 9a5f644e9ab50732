"""A request-plane peer run as a real process by the failure tests (then SIGKILLed).

``peer.py server`` prints its address and streams "count" forever; ``peer.py client
ADDRESS`` streams ADDRESS's "hold", prints "streaming" after the first chunk, then stalls.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

from dynamoctl.planes.request import RequestClient, RequestServer

HEARTBEAT_INTERVAL = 0.2
HEARTBEAT_TIMEOUT = 1.0


async def count(body: bytes) -> AsyncIterator[bytes]:
    i = 0
    while True:
        yield str(i).encode()
        i += 1
        await asyncio.sleep(0.001)


async def serve() -> None:
    async with RequestServer(heartbeat_timeout=HEARTBEAT_TIMEOUT) as server:
        server.register("count", count)
        print(server.address, flush=True)
        await asyncio.Event().wait()


async def stall(address: str) -> None:
    async with RequestClient(
        heartbeat_interval=HEARTBEAT_INTERVAL, heartbeat_timeout=HEARTBEAT_TIMEOUT
    ) as client:
        stream = client.stream(address, "hold", b"")
        await anext(stream)
        print("streaming", flush=True)
        await asyncio.Event().wait()  # keep the stream open, never consume again


if __name__ == "__main__":
    if sys.argv[1] == "server":
        asyncio.run(serve())
    else:
        asyncio.run(stall(sys.argv[2]))
