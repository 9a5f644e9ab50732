"""Models appear with their first worker and disappear with their last; several at once."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx

from tests.frontend.conftest import Deployment


async def listed(dep: Deployment) -> list[str]:
    async with httpx.AsyncClient() as http:
        return [m["id"] for m in (await http.get(f"{dep.frontend_url}/v1/models")).json()["data"]]


async def until(dep: Deployment, expected: list[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (got := await listed(dep)) != expected:
        assert time.monotonic() < deadline, f"models {got}, expected {expected}"
        await asyncio.sleep(0.1)


async def test_models_come_and_go_with_workers(tmp_path: Path) -> None:
    dep = Deployment(tmp_path)
    try:
        dep.spawn("frontend", "frontend", "--port", "0")
        await dep.wait_for("frontend", 1)
        dep.frontend_url = (await dep.records("frontend"))[0].address
        async with httpx.AsyncClient() as http:
            health = await http.get(f"{dep.frontend_url}/health")
        assert health.status_code == 503 and await listed(dep) == []

        alpha = dep.spawn("alpha", "worker", "--model", "alpha", "--block-size", "16")
        await until(dep, ["alpha"])
        beta = dep.spawn("beta", "worker", "--model", "beta", "--block-size", "32")
        await until(dep, ["alpha", "beta"])
        async with httpx.AsyncClient() as http:
            for model in ("alpha", "beta"):
                resp = await http.post(
                    f"{dep.frontend_url}/v1/completions",
                    json={"model": model, "prompt": "hi", "max_tokens": 3, "ignore_eos": True},
                )
                assert resp.status_code == 200 and resp.json()["model"] == model

        alpha.send_signal(signal.SIGTERM)  # drained: its model card leaves discovery
        await until(dep, ["beta"])
        beta.kill()  # killed: its card expires with the lease
        await until(dep, [])
    finally:
        dep.stop()
