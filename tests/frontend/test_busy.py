"""All workers busy: requests wait in a bounded queue, then get 503 with Retry-After."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.frontend.conftest import MODEL, Deployment


async def test_busy_workers_queue_then_503(tmp_path: Path) -> None:
    dep = Deployment(tmp_path)
    try:
        # One small, slow worker: one long request makes it "busy" (KV usage > 5 %).
        dep.worker("--num-gpu-blocks", "64", "--speedup-ratio", "1")
        await dep.wait_for("worker", 1)
        busy = ["--busy-kv-usage", "0.05"]
        await dep.start_frontend(*busy, "--queue-timeout", "0.5")
        impatient = dep.frontend_url
        dep.spawn("frontend2", "frontend", "--port", "0", *busy, "--queue-timeout", "20")
        await dep.wait_for("frontend", 2)
        (patient,) = [a for r in await dep.records("frontend") if (a := r.address) != impatient]
        async with httpx.AsyncClient() as http:  # it lists the model once it saw the worker
            for _ in range(300):
                if (await http.get(f"{patient}/v1/models")).json()["data"]:
                    break
                await asyncio.sleep(0.1)
        long_body = {"model": MODEL, "prompt": "word " * 100, "max_tokens": 300,
                     "ignore_eos": True, "stream": True}  # fmt: skip
        small = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
        async with httpx.AsyncClient(timeout=60) as http:
            async with http.stream("POST", f"{impatient}/v1/completions", json=long_body) as r:
                chunks = r.aiter_bytes()
                await anext(chunks)  # the long request is running
                await asyncio.sleep(0.5)  # let the worker's load reach the routers
                refused = await http.post(f"{impatient}/v1/completions", json=small)
                assert refused.status_code == 503
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["type"] == "service_unavailable"
                queued_at = time.monotonic()
                waiting = asyncio.create_task(http.post(f"{patient}/v1/completions", json=small))
                await asyncio.sleep(0.5)
                assert not waiting.done(), "should wait while the worker is busy"
                async for _ in chunks:  # drain: the long request finishes
                    pass
            served = await waiting
            assert served.status_code == 200, served.text
            assert time.monotonic() - queued_at > 0.5
            metrics = (await http.get(f"{impatient}/metrics")).text
        assert f'dynamoctl_frontend_rejections_total{{model="{MODEL}"}} 1.0' in metrics
    finally:
        dep.stop()
