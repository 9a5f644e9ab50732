"""A separate process that registers one key and keeps its lease: the thing tests kill.

Usage: python owner.py DISCOVERY_URL KEY VALUE TTL
Prints ``registered`` once the key is written, then runs until killed.
"""

import asyncio
import sys

from dynamoctl.discovery import Discovery, store_from_url


async def main(url: str, key: str, value: str, ttl: float) -> None:
    async with Discovery(store_from_url(url), lease_ttl=ttl) as disc:
        await disc.register(key, value.encode())
        print("registered", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
