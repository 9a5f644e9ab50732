"""Hosts get addresses before anything starts, and the plan gives each worker a KV-transfer
side channel on its node's address with a port no other replica of the deployment uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamoctl.plan.build import PlanError, build_plan
from dynamoctl.plan.hosts import Host, HostError, parse_resolve, resolve_host
from dynamoctl.recipe.loader import RecipeError, load_recipe_text


def _ssh(hosts: str, workers: str, extra: str = "") -> str:
    return f"""\
schema: 1
name: h
discovery: {{backend: etcd, managed: true}}
target: {{kind: ssh, hosts: {hosts}, gpus_per_host: 4{extra}}}
model: {{name: m, path: /models/m, block_size: 32}}
workers:
{workers}"""


NIXL = "kv-transfer-config: {kv_connector: NixlConnector, kv_role: kv_both}"


def test_a_name_that_does_not_resolve_is_refused_naming_host_and_field() -> None:
    with pytest.raises(HostError) as err:
        resolve_host("no-such-host.invalid", {}, field="target.hosts", spans=True)
    text = str(err.value)
    assert text.startswith("target.hosts: host 'no-such-host.invalid' does not resolve")
    assert "target.addresses: {no-such-host.invalid: ADDRESS}" in text


def test_loopback_is_refused_only_when_the_deployment_spans_hosts() -> None:
    with pytest.raises(HostError, match=r"host 'localhost' resolves to the loopback address"):
        resolve_host("localhost", {}, field="target.hosts", spans=True)
    assert resolve_host("localhost", {}, field="target.hosts", spans=False).address.startswith(
        "127."
    )
    # An address given for the name wins over resolution (and is checked the same way).
    given = resolve_host("gpu-a", {"gpu-a": "192.0.2.7"}, field="target.hosts", spans=True)
    assert given == Host("gpu-a", "192.0.2.7")
    with pytest.raises(HostError, match="loopback"):
        resolve_host("gpu-a", {"gpu-a": "127.0.1.1"}, field="target.hosts", spans=True)


def test_resolve_entries_must_be_name_equals_ipv4() -> None:
    assert parse_resolve(["a=192.0.2.1", "b=10.0.0.2"]) == {"a": "192.0.2.1", "b": "10.0.0.2"}
    for bad in ("a", "=192.0.2.1", "a=gpu-node", "a=300.1.1.1"):
        with pytest.raises(HostError, match="expected NAME=IPV4ADDRESS"):
            parse_resolve([bad])


def test_ssh_plan_binds_addresses_and_names_hosts() -> None:
    recipe = load_recipe_text(
        _ssh(
            "[gpu-a, gpu-b]",
            "  agg: {engine: mocker, replicas: 2, gpus_per_replica: 4}",
            ", addresses: {gpu-a: 192.0.2.1, gpu-b: 192.0.2.2}",
        ),
        "r.yaml",
    )
    plan, _ = build_plan(recipe, Path("/run"))
    assert plan.hosts == [Host("gpu-a", "192.0.2.1"), Host("gpu-b", "192.0.2.2")]
    assert plan.discovery_url == "etcd+https://192.0.2.1:2379"  # TLS on ssh by default
    assert plan.endpoint == "http://gpu-a:8000/v1"  # people use names
    etcd, *workers, frontend = plan.instances
    assert "--listen-client-urls=https://192.0.2.1:2379" in etcd.argv
    assert "--advertise-client-urls=https://gpu-a:2379" in etcd.argv
    assert [(w.host, w.argv[w.argv.index("--host") + 1]) for w in workers] == [
        ("gpu-a", "192.0.2.1"),
        ("gpu-b", "192.0.2.2"),
    ]
    # The frontend listens on the head's address by default: the supervisor probes it there.
    assert frontend.argv[frontend.argv.index("--host") + 1] == "192.0.2.1"
    assert (frontend.address, frontend.ports) == ("192.0.2.1", {"http": 8000})


def test_addresses_must_name_listed_hosts_and_be_ipv4() -> None:
    with pytest.raises(RecipeError, match=r"target.addresses.gpu-c: is not one of target.hosts"):
        load_recipe_text(
            _ssh("[gpu-a]", "  agg: {engine: mocker}", ", addresses: {gpu-c: 192.0.2.1}"), "r.yaml"
        )
    with pytest.raises(RecipeError, match=r"target.addresses.gpu-a: .*IPv4"):
        load_recipe_text(
            _ssh("[gpu-a]", "  agg: {engine: mocker}", ", addresses: {gpu-a: gpu-a.lan}"), "r.yaml"
        )


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_a_loopback_frontend_on_a_remote_target_is_refused(host: str) -> None:
    text = _ssh("[gpu-a, gpu-b]", "  agg: {engine: mocker}").replace(
        "model:", f"frontend: {{host: '{host}'}}\nmodel:"
    )
    with pytest.raises(RecipeError) as err:
        load_recipe_text(text, "r.yaml")
    assert "r.yaml:5 frontend.host:" in str(err.value)
    assert "leave it out to listen on the head node's address, or use 0.0.0.0" in str(err.value)


def test_vllm_workers_get_a_side_channel_on_their_node_with_ports_unique_per_replica() -> None:
    recipe = load_recipe_text(
        _ssh(
            "[gpu-a, gpu-b]",
            f"  prefill: {{engine: vllm, replicas: 2, gpus_per_replica: 2,"
            f" engine_args: {{{NIXL}}}}}\n"
            f"  decode: {{engine: vllm, replicas: 2, gpus_per_replica: 2,"
            f" engine_args: {{{NIXL}, data-parallel-size: 2}}}}",
            ", addresses: {gpu-a: 192.0.2.1, gpu-b: 192.0.2.2}",
        ),
        "r.yaml",
    )
    plan, _ = build_plan(recipe, Path("/run"))
    workers = [s for s in plan.instances if s.component == "worker"]
    seen = {
        (w.name, w.host): (
            w.env["VLLM_NIXL_SIDE_CHANNEL_HOST"],
            w.env["VLLM_NIXL_SIDE_CHANNEL_PORT"],
        )
        for w in workers
    }
    assert seen == {
        ("prefill-0", "gpu-a"): ("192.0.2.1", "5600"),
        ("prefill-1", "gpu-a"): ("192.0.2.1", "5601"),
        ("decode-0", "gpu-b"): ("192.0.2.2", "5700"),
        ("decode-1", "gpu-b"): ("192.0.2.2", "5702"),  # two data-parallel ranks each
    }
    decode = plan.by_pool("decode")[1]
    assert decode.ports == {"nixl_side_channel": 5702, "nixl_side_channel_dp1": 5703}
    taken = [p for w in workers for p in w.ports.values()]
    assert len(taken) == len(set(taken))


def test_sglang_prefill_opens_its_bootstrap_on_its_node() -> None:
    mode = "disaggregation-mode"
    recipe = load_recipe_text(
        _ssh(
            "[gpu-a, gpu-b]",
            f"  prefill: {{engine: sglang, replicas: 2, gpus_per_replica: 2, "
            f"engine_args: {{{mode}: prefill}}}}\n"
            f"  decode: {{engine: sglang, gpus_per_replica: 4, engine_args: {{{mode}: decode}}}}",
            ", addresses: {gpu-a: 192.0.2.1, gpu-b: 192.0.2.2}",
        ),
        "r.yaml",
    )
    plan, _ = build_plan(recipe, Path("/run"))
    p0, p1 = plan.by_pool("prefill")
    for spec, port in ((p0, 8998), (p1, 8999)):
        argv = spec.argv
        assert argv[argv.index("--disaggregation-bootstrap-port") + 1] == str(port)
        assert argv[argv.index("--host", argv.index("--label")) + 1] == "192.0.2.1"
        assert spec.ports == {"bootstrap": port} and spec.env["SGLANG_HOST_IP"] == "192.0.2.1"
    (decode,) = plan.by_pool("decode")
    assert decode.ports == {} and decode.env["SGLANG_HOST_IP"] == "192.0.2.2"


def test_too_many_replicas_for_the_side_channel_block_is_refused() -> None:
    recipe = load_recipe_text(
        _ssh(
            "[gpu-a]",
            f"  agg: {{engine: vllm, replicas: 51, gpus_per_replica: 0,"
            f" engine_args: {{{NIXL}, data-parallel-size: 2}}}}",
            ", addresses: {gpu-a: 192.0.2.1}",
        ),
        "r.yaml",
    )
    with pytest.raises(PlanError, match=r"workers.agg.replicas: replica 50 needs NIXL"):
        build_plan(recipe, Path("/run"))


def test_a_slurm_allocation_smaller_than_the_recipe_names_the_sbatch_options() -> None:
    recipe = load_recipe_text(
        """\
schema: 1
name: s
discovery: {backend: etcd, managed: true}
target: {kind: slurm, partition: gpu, nodes: 3, gpus_per_node: 2}
model: {name: m, path: m}
workers:
  agg: {engine: mocker, gpus_per_replica: 2}
""",
        "s.yaml",
    )
    with pytest.raises(PlanError) as err:
        build_plan(recipe, Path("/run"), allocation=["n1"], resolve={"n1": "192.0.2.5"})
    text = str(err.value)
    assert text.startswith("target.nodes: the recipe needs 3 node(s) but this Slurm allocation")
    assert "sbatch --nodes=3 --gpus-per-node=2 --partition=gpu slurm/launch.sh RECIPE" in text


@pytest.mark.parametrize("size", ["abc", "[1]", ".inf", "0", "true"])
def test_a_bad_data_parallel_size_is_a_plan_error(size: str) -> None:
    recipe = load_recipe_text(
        _ssh(
            "[gpu-a]",
            f"  agg: {{engine: vllm, gpus_per_replica: 0,"
            f" engine_args: {{{NIXL}, data-parallel-size: {size}}}}}",
            ", addresses: {gpu-a: 192.0.2.1}",
        ),
        "r.yaml",
    )
    with pytest.raises(PlanError, match=r"workers.agg.engine_args.data-parallel-size: .* whole"):
        build_plan(recipe, Path("/run"))
