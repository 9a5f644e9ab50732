"""A frontend with no models to serve is alive, not hung (docs/operations.md, "Health and
readiness"): while every worker is gone (a pool scaled to 0, a long gang restart) its
``/health`` (readiness, what a load balancer asks) says 503, but the supervisor judges
the process by ``/live`` and keeps it; the workers' return makes it serve again."""

from __future__ import annotations

import time

import httpx

from tests.supervisor.conftest import Cli, free_port, mocker_recipe


def test_a_frontend_without_workers_is_kept_past_hang_timeout(cli: Cli) -> None:
    port = free_port()
    recipe = cli.recipe(mocker_recipe("nomodels", port, replicas=1))  # hang_timeout: 4
    up = cli("up", str(recipe), "--detach")
    assert up.returncode == 0, up.stderr
    frontend = f"http://127.0.0.1:{port}"
    pid = next(r["pid"] for r in cli.status()["instances"] if r["name"] == "frontend-0")
    down = cli("scale", "agg=0", "--name", "nomodels")
    assert down.returncode == 0, down.stderr
    # Readiness off for three hang_timeouts: long enough for the old probe to kill it.
    not_ready_since: float | None = None
    deadline = time.monotonic() + 60
    while not_ready_since is None or time.monotonic() - not_ready_since < 12:
        assert time.monotonic() < deadline, "the frontend never reported no models"
        try:
            health = httpx.get(f"{frontend}/health", trust_env=False, timeout=5)
        except httpx.TransportError as e:
            raise AssertionError(f"the frontend went away while it had no models: {e}") from e
        if health.status_code == 503 and not_ready_since is None:
            assert health.json()["models"] == []
            not_ready_since = time.monotonic()
        time.sleep(0.5)
    row = next(r for r in cli.status()["instances"] if r["name"] == "frontend-0")
    assert (row["state"], row["restarts"], row["pid"]) == ("READY", 0, pid), row
    assert httpx.get(f"{frontend}/live", trust_env=False, timeout=5).status_code == 200
    back = cli("scale", "agg=1", "--name", "nomodels")
    assert back.returncode == 0, back.stderr
    reply = httpx.post(
        f"{frontend}/v1/completions",
        json={"model": "mock-llama", "prompt": "hi", "max_tokens": 4},
        trust_env=False, timeout=30,
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    row = next(r for r in cli.status()["instances"] if r["name"] == "frontend-0")
    assert (row["restarts"], row["pid"]) == (0, pid), row
