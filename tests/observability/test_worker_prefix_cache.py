"""A worker counts the prompt tokens it receives and those its engine served from the
prefix cache, as the engine reported them, so hit rate per worker is a ratio of rates."""

from __future__ import annotations

import asyncio
import json

import httpx
import msgspec
import openai
from prometheus_client.parser import text_string_to_metric_families

from dynamoctl.discovery import store_from_url
from dynamoctl.discovery.keys import instances_prefix
from dynamoctl.wire.records import InstanceRecord
from tests.supervisor.conftest import Cli, free_port, mocker_recipe


def worker_metrics_url(discovery_url: str, namespace: str) -> str:
    async def find() -> str:
        store = store_from_url(discovery_url)
        try:
            listing = await store.list(instances_prefix(namespace, "worker"))
        finally:
            await store.close()
        (value,) = listing.items.values()
        url = msgspec.json.decode(value, type=InstanceRecord).metrics_url
        assert url is not None
        return url

    return asyncio.run(find())


def counters(url: str) -> tuple[float, float]:
    """(prompt tokens, cached prompt tokens) of the one instance behind ``url``."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url, trust_env=False).text):
        for sample in family.samples:
            found[sample.name] = found.get(sample.name, 0.0) + sample.value
    return found["dynamoctl_worker_prompt_tokens_total"], found[
        "dynamoctl_worker_cached_tokens_total"
    ]


def test_same_prompt_twice_is_a_cache_hit_on_the_worker(cli: Cli) -> None:
    port = free_port()
    recipe = cli.recipe(mocker_recipe("prefix", port, replicas=1))
    up = cli("up", str(recipe), "--detach")
    assert up.returncode == 0, up.stderr
    plan = json.loads((cli.home / "runs" / "prefix" / "state.json").read_text())["plan"]
    url = worker_metrics_url(plan["discovery_url"], plan["namespace"])
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=30)
    prompt = list(range(1000, 1000 + 16 * 20))  # 20 full blocks of 16 tokens

    seen = [counters(url)]
    usage = []
    for _ in range(2):
        out = client.completions.create(model="mock-llama", prompt=prompt, max_tokens=4)
        assert out.usage is not None
        usage.append(out.usage)
        seen.append(counters(url))
    (p0, c0), (p1, c1), (p2, c2) = seen
    assert p1 - p0 == len(prompt) == p2 - p1
    assert c1 - c0 == 0  # a prompt the worker has never seen
    assert c2 - c1 > 0  # the same prompt again: served from the prefix cache
    details = usage[1].prompt_tokens_details
    assert details is not None and c2 - c1 == details.cached_tokens  # what the client was told
    assert cli("down").returncode == 0
