"""A key's class priority reaches the engine (docs/security.md, "Priority classes"): a
mocker worker started with ``--scheduling-policy priority`` and room for one running
request admits an interactive key's request (class priority 10) ahead of the batch key's
requests that reached it before; with first come first served it is served last."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.frontend.conftest import MODEL, Deployment
from tests.frontend.test_key_limits import auth, blocking, keyed_frontend

KEYS = """\
classes:
  interactive: {weight: 8, priority: 10}
  batch: {weight: 1}
keys:
  - {name: chat, key: sk-chat-5e1a, class: interactive}
  - {name: nightly, key: sk-nightly-93fb, class: batch}
"""
BATCH = 4


@pytest.mark.parametrize(("policy", "chat_place"), [("priority", 0), ("fcfs", BATCH)])
async def test_class_priority_orders_the_engines_waiting_queue(
    tmp_path: Path, policy: str, chat_place: int
) -> None:
    (tmp_path / "keys.yaml").write_text(KEYS)
    dep = Deployment(tmp_path)
    try:
        # One request runs at a time: the others wait in the engine's own queue (the
        # frontend never finds the worker busy: no admission queue in play).
        dep.worker("--num-gpu-blocks", "256", "--speedup-ratio", "1", "--max-num-seqs", "1",
                   "--scheduling-policy", policy)  # fmt: skip
        await dep.wait_for("worker", 1)
        url = await keyed_frontend(dep, tmp_path / "keys.yaml", "sk-chat-5e1a",
                                   "--busy-kv-usage", "1")  # fmt: skip
        finished: list[str] = []

        async def send(http: httpx.AsyncClient, who: str, key: str, prompt: str) -> None:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 5, "ignore_eos": True}
            resp = await http.post(f"{url}/v1/completions", json=body, headers=auth(key))
            assert resp.status_code == 200, resp.text
            finished.append(who)

        async with httpx.AsyncClient(timeout=120) as http:
            async with blocking(http, url, "sk-nightly-93fb", 50, 200) as chunks:
                # The blocker runs: the rest queue in the engine.
                tasks = [
                    asyncio.create_task(
                        send(http, f"batch{i}", "sk-nightly-93fb", f"{i} word" * 20)
                    )
                    for i in range(BATCH)
                ]
                await asyncio.sleep(0.5)
                tasks.append(asyncio.create_task(send(http, "chat", "sk-chat-5e1a", "hi")))
                await asyncio.sleep(0.5)
                assert not finished, "every request waits for the blocker"
                async for _ in chunks:
                    pass
            await asyncio.gather(*tasks)
        assert finished.index("chat") == chat_place, finished
    finally:
        dep.stop()
