"""LoRA adapters on a running mocker deployment, through the real CLI: a recipe's adapter
served at ``up`` as a model of its own, ``dynamoctl lora load|ls|unload`` through the
supervisor, the capacity a pool declares, a 404 after an unload, and KV blocks that the
adapter does not share with the base model."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx

from dynamoctl.discovery import keys, store_from_url
from tests.supervisor.conftest import Cli, free_port, mocker_recipe


def adapter_dir(root: Path, name: str, base: str = "mock-llama") -> str:
    path = root / name
    path.mkdir()
    config = {"peft_type": "LORA", "base_model_name_or_path": base, "r": 8}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return str(path)


def wait_models(http: httpx.Client, want: set[str], timeout: float = 30.0) -> list[dict]:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while True:
        data = http.get("/v1/models").json()["data"]
        if {m["id"] for m in data} == want:
            return data  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"models {data}, wanted {want}"
        time.sleep(0.2)


def complete(http: httpx.Client, model: str, prompt: str) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    return http.post("/v1/completions", json=body)


def test_lora_adapters_load_serve_list_unload(cli: Cli, tmp_path: Path) -> None:
    port = free_port()
    sql = adapter_dir(tmp_path, "sql")
    lora = f"""\
    lora:
      max_loras: 2
      adapters: [{{name: sql, path: {sql}, base_model: mock-llama}}]"""
    text = mocker_recipe("lora", port, replicas=1).replace(
        "speedup-ratio: 10}", "speedup-ratio: 10}\n" + lora
    )
    recipe = cli.recipe(text)
    up = cli("up", str(recipe), "--detach")
    assert up.returncode == 0, up.stderr
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, trust_env=False)

    # The recipe's adapter is a model whose parent is the base (as vLLM lists them).
    models = {m["id"]: m for m in wait_models(http, {"mock-llama", "sql"})}
    assert models["sql"]["parent"] == "mock-llama" and models["mock-llama"]["parent"] is None

    # Same prompt: the base model's cached blocks are no hit for the adapter; its own are.
    prompt = "the adapter keeps its own blocks " * 12
    usage = [complete(http, m, prompt).json()["usage"] for m in ("mock-llama", "mock-llama")]
    assert usage[1]["prompt_tokens_details"]["cached_tokens"] > 0
    first = complete(http, "sql", prompt)
    assert first.status_code == 200, first.text
    assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    again = complete(http, "sql", prompt).json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] > 0

    # Runtime load through the supervisor; `ls` shows who holds what.
    chat = adapter_dir(tmp_path, "chat")
    loaded = cli("lora", "load", "chat", chat)
    assert loaded.returncode == 0, loaded.stderr
    assert "served by agg-0" in loaded.stdout
    assert complete(http, "chat", "hi").status_code == 200
    listing = json.loads(cli("lora", "ls", "--json").stdout)["adapters"]
    assert {a["spec"]["name"]: a["workers"] for a in listing} == {
        "chat": ["agg-0"], "sql": ["agg-0"],
    }  # fmt: skip
    # ... and so do `status` (from the worker's /health) and its discovery record.
    held = cli.wait_for(
        lambda r: any(x["adapters"] == ["chat", "sql"] for x in r["instances"]),
        what="status showing agg-0's adapters",
    )
    assert next(x for x in held["instances"] if x["name"] == "agg-0")["adapters"] == ["chat", "sql"]
    assert "LoRA adapters: agg-0: chat, sql" in cli("status").stdout
    plan = json.loads((cli.home / "runs" / "lora" / "state.json").read_text())["plan"]
    url, ns = plan["discovery_url"], plan["namespace"]

    async def worker_records() -> list[dict]:  # type: ignore[type-arg]
        store = store_from_url(url)
        try:
            listing = await store.list(keys.instances_prefix(ns, "worker"))
            return [json.loads(value) for value in listing.items.values()]
        finally:
            await store.close()

    assert [r["adapters"] for r in asyncio.run(worker_records())] == [["chat", "sql"]]

    # Past max_loras (2): the worker refuses it, and the command says no worker took it.
    third = cli("lora", "load", "third", adapter_dir(tmp_path, "third"), "--timeout", "3")
    assert third.returncode == 1 and "no worker loaded it" in third.stderr
    assert cli("lora", "unload", "third").returncode == 0
    # A base-model check that fails, and a pool without `lora`, are refused.
    other = adapter_dir(tmp_path, "other", base="someone-else")
    wrong = cli("lora", "load", "other", other, "--base-model", "mock-llama", "--timeout", "3")
    assert wrong.returncode == 1
    worker_log = next((cli.home / "runs" / "lora").rglob("agg-0*.log")).read_text()
    assert "base_model_name_or_path 'someone-else'" in worker_log
    assert cli("lora", "unload", "other").returncode == 0
    nopool = cli("lora", "load", "x", chat, "--pool", "decode")
    assert nopool.returncode == 1 and "no `lora` section" in nopool.stderr

    # Unload: the adapter leaves /v1/models and its requests are a 404 naming `model`.
    assert cli("lora", "unload", "chat").returncode == 0
    wait_models(http, {"mock-llama", "sql"})
    gone = complete(http, "chat", "hi")
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "model"
    assert "not loaded" in gone.json()["error"]["message"]
    missing = cli("lora", "unload", "chat")
    assert missing.returncode == 1 and "no adapter 'chat'" in missing.stderr
    assert complete(http, "sql", "still here").status_code == 200
    assert cli("down").returncode == 0
