"""Multi-node replicas (gangs) in the recipe and the plan: whole nodes, every member's rank
flags, and the bad input of issue 14 refused with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamoctl.launch.api import InstanceSpec, port_in_use
from dynamoctl.plan.build import PlanError, build_plan
from dynamoctl.recipe.loader import RecipeError, load_recipe_text
from dynamoctl.supervisor.instance import InstanceName
from dynamoctl.wire.engine_args import parse_engine_args

SLURM = "target: {kind: slurm, partition: gpu, nodes: NODES, gpus_per_node: 8}"


def _recipe(pool: str, nodes: int = 4, engine: str = "vllm") -> str:
    return f"""\
schema: 1
name: g
discovery: {{backend: etcd, managed: true}}
{SLURM.replace("NODES", str(nodes))}
model: {{name: m, path: /m}}
workers:
  agg: {{engine: {engine}, {pool}}}
"""


def _plan(text: str, nodes: int = 4) -> list[InstanceSpec]:
    recipe = load_recipe_text(text, "r.yaml")
    allocation = [f"n{i}" for i in range(nodes)]
    resolve = {name: f"192.0.2.{i + 1}" for i, name in enumerate(allocation)}
    plan, _ = build_plan(recipe, Path("/run"), allocation, resolve)
    return plan.by_pool("agg")


def _engine_args(spec: InstanceSpec) -> dict[str, object]:
    argv = spec.argv
    start = argv.index("--") + 1 if "--" in argv else argv.index("--engine") + 2
    if "--" not in argv:
        start = argv.index("--role") + 2
    return parse_engine_args(argv[start:])


def test_a_tp16_gang_takes_two_whole_nodes_with_ranks_and_one_rendezvous() -> None:
    specs = _plan(
        _recipe(
            "replicas: 2, nodes_per_replica: 2, gpus_per_replica: 16, "
            "engine_args: {tensor-parallel-size: 16}"
        )
    )
    assert [(s.name, s.component, s.host, s.gang, s.rank) for s in specs] == [
        ("agg-0", "worker", "n0", "agg-0", 0),
        ("agg-0.1", "follower", "n1", "agg-0", 1),
        ("agg-1", "worker", "n2", "agg-1", 0),
        ("agg-1.1", "follower", "n3", "agg-1", 1),
    ]
    leader, follower = (_engine_args(s) for s in specs[:2])
    assert (leader["nnodes"], leader["node_rank"], leader["master_addr"]) == (2, 0, "192.0.2.1")
    assert (follower["node_rank"], follower["master_port"], follower["headless"]) == (
        1,
        29501,
        True,
    )
    assert "headless" not in leader
    assert all(s.gpus == list(range(8)) for s in specs)
    assert specs[1].env["VLLM_HOST_IP"] == "192.0.2.2"
    assert "--rendezvous" in specs[1].argv and "192.0.2.1:29501" in specs[1].argv
    assert specs[0].ports["rendezvous"] == 29501


def test_a_data_parallel_gang_splits_its_ranks_over_the_nodes() -> None:
    specs = _plan(
        _recipe(
            "nodes_per_replica: 4, gpus_per_replica: 32, "
            "engine_args: {data-parallel-size: 32, enable-expert-parallel: true}"
        )
    )
    starts = [_engine_args(s).get("data_parallel_start_rank", 0) for s in specs]
    assert starts == [0, 8, 16, 24]
    assert {_engine_args(s)["data_parallel_size_local"] for s in specs} == {8}
    assert {_engine_args(s)["data_parallel_address"] for s in specs} == {"192.0.2.1"}


def test_sglang_members_get_dist_init_addr() -> None:
    specs = _plan(
        _recipe(
            "nodes_per_replica: 2, gpus_per_replica: 16, engine_args: {tp: 16}", engine="sglang"
        )
    )
    args = [_engine_args(s) for s in specs]
    assert [(a["nnodes"], a["node_rank"], a["dist_init_addr"]) for a in args] == [
        (2, 0, "192.0.2.1:29501"),
        (2, 1, "192.0.2.1:29501"),
    ]
    # The follower serves SGLang's dummy health check on its own address, a declared port.
    assert "host" not in args[0] and (args[1]["host"], args[1]["port"]) == ("192.0.2.2", 30000)
    assert specs[1].ports == {"health": 30000}
    assert specs[1].argv[3:7] == ["follower", "--engine", "sglang", "--label"]
    assert [s.env["SGLANG_HOST_IP"] for s in specs] == ["192.0.2.1", "192.0.2.2"]
    assert all("VLLM_HOST_IP" not in s.env for s in specs)


def test_data_parallel_members_declare_the_nixl_ports_of_their_own_ranks() -> None:
    """vLLM's DP rank r listens on VLLM_NIXL_SIDE_CHANNEL_PORT + r (its global rank): every
    member shares the replica's base and declares its node's ranks, none twice."""
    specs = _plan(
        _recipe(
            "nodes_per_replica: 4, gpus_per_replica: 32, engine_args: {data-parallel-size: 32, "
            "kv-transfer-config: {kv_connector: NixlConnector, kv_role: kv_both}}"
        )
    )
    assert {s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in specs} == {"5800"}  # agg's block
    for k, spec in enumerate(specs):
        nixl = {n: p for n, p in spec.ports.items() if n.startswith("nixl")}
        ranks = range(8 * k, 8 * k + 8)
        assert nixl == {
            (f"nixl_side_channel_dp{r}" if r else "nixl_side_channel"): 5800 + r for r in ranks
        }, spec.name


LOCAL_GANGS = """\
schema: 1
name: g
model: {name: m, path: m}
workers:
WORKERS  agg: {engine: mocker, replicas: 2, nodes_per_replica: 2, gpus_per_replica: 0}
"""
"""Two local mocker gangs; ``WORKERS``: more of the workers section."""


def _local_gangs(workers: str = "") -> list[InstanceSpec]:
    text = LOCAL_GANGS.replace("WORKERS", workers)
    plan, _ = build_plan(load_recipe_text(text, "r.yaml"), Path("/run"))
    return plan.by_pool("agg")


def test_a_local_mocker_gang_shares_the_host_with_a_port_per_gang() -> None:
    specs = _local_gangs()
    assert [s.name for s in specs] == ["agg-0", "agg-0.1", "agg-1", "agg-1.1"]
    assert [_engine_args(s)["master_port"] for s in specs] == [29701, 29701, 29702, 29702]


def test_two_deployments_sharing_a_host_set_their_own_rendezvous_ports() -> None:
    # Two local gang deployments at once (CI's serial lanes) collided on 29701: the
    # recipe moves a deployment's rendezvous ports, and a busy one names that field.
    specs = _local_gangs("  rendezvous_port: 31000\n")
    assert [_engine_args(s)["master_port"] for s in specs] == [31200, 31200, 31201, 31201]
    assert specs[0].ports["rendezvous"] == 31200
    error = port_in_use(specs[0], "rendezvous", 31200, "Address already in use")
    assert "port 31200 (rendezvous)" in str(error) and "workers.rendezvous_port" in str(error)


def test_follower_names_parse_and_order_after_their_leader() -> None:
    spec = InstanceSpec(name="decode-3.2", pool="decode", component="follower", host="h", argv=[])
    name = InstanceName.of(spec)
    assert (name.index, name.rank, str(name), str(name.leader)) == (3, 2, "decode-3.2", "decode-3")
    assert sorted(
        [InstanceName("agg", 1, 1), InstanceName("agg", 1), InstanceName("agg", 0, 1)]
    ) == [
        InstanceName("agg", 0, 1),
        InstanceName("agg", 1),
        InstanceName("agg", 1, 1),
    ]


@pytest.mark.parametrize(
    ("pool", "nodes", "field", "says"),
    [
        (
            "nodes_per_replica: 2, gpus_per_replica: 16, engine_args: {tensor-parallel-size: 8}",
            4,
            "workers.agg.engine_args.tensor-parallel-size",
            "tensor-parallel-size 8 = 8 GPUs but the replica has 2 nodes x 8 = 16",
        ),
        (
            "nodes_per_replica: 2, gpus_per_replica: 16, "
            "engine_args: {tensor-parallel-size: 8, pipeline-parallel-size: 3}",
            4,
            "workers.agg.engine_args.tensor-parallel-size",
            "tensor-parallel-size 8 x pipeline-parallel-size 3 = 24 GPUs",
        ),
        (
            "nodes_per_replica: 2, gpus_per_replica: 8",
            4,
            "workers.agg.gpus_per_replica",
            "a replica of 2 whole nodes has 2 x 8 = 16 GPUs",
        ),
        (
            "nodes_per_replica: 4, gpus_per_replica: 32",
            2,
            "workers.agg.nodes_per_replica",
            "4 nodes per replica but the target has 2 (target.nodes)",
        ),
        (
            "nodes_per_replica: 2, gpus_per_replica: 16, engine_args: {node-rank: 1}",
            4,
            "workers.agg.engine_args.node-rank",
            "is set by dynamoctl for each member",
        ),
        (
            "nodes_per_replica: 2, gpus_per_replica: 16, engine_args: {tp: 16}",
            4,
            "workers.agg.engine_args.tp",
            "write tensor-parallel-size",
        ),
        (
            "nodes_per_replica: 2, gpus_per_replica: 16, engine_args: {master-addr: 10.0.0.1}",
            4,
            "workers.agg.engine_args.master-addr",
            "is set by dynamoctl",
        ),
    ],
)
def test_bad_gangs_are_refused_naming_the_field(
    pool: str, nodes: int, field: str, says: str
) -> None:
    with pytest.raises(RecipeError) as error:
        load_recipe_text(_recipe(pool, nodes), "r.yaml")
    assert field in str(error.value) and says in str(error.value)


def test_a_gang_on_a_local_target_is_the_mockers_only() -> None:
    text = """\
schema: 1
name: g
target: {kind: local, gpus: 8}
model: {name: m, path: m}
workers:
  agg: {engine: vllm, nodes_per_replica: 2, gpus_per_replica: 8}
"""
    with pytest.raises(RecipeError, match=r"workers.agg.nodes_per_replica.*only the mocker"):
        load_recipe_text(text, "r.yaml")


SSH = "target: {kind: ssh, hosts: [10.0.0.1, 10.0.0.2], gpus_per_host: 8}"


def test_a_trtllm_gang_is_one_mpi_world_on_slurm() -> None:
    specs = _plan(
        _recipe(
            "nodes_per_replica: 2, gpus_per_replica: 16, engine_args: {tensor-parallel-size: 16, "
            "kv-cache-config: {free_gpu_memory_fraction: 0.85}}",
            engine="trtllm",
        )
    )
    assert len(specs) == 1  # no followers: the MPI launcher starts every rank
    (spec,) = specs
    assert (spec.name, spec.host, spec.gang, spec.nnodes) == ("agg-0", "n0", "agg-0", 2)
    assert (spec.mpi_nodes, spec.mpi_tasks_per_node) == (["n0", "n1"], 8)
    assert spec.argv[0] == "trtllm-llmapi-launch" and spec.argv[2:5] == [
        "-m",
        "dynamoctl",
        "worker",
    ]
    # It word-splits its command: JSON without blanks, no rank flags of ours.
    assert '{"free_gpu_memory_fraction":0.85}' in spec.argv
    assert not any(" " in arg for arg in spec.argv)
    assert not {"--nnodes", "--node-rank", "--master-addr"} & set(spec.argv)

    from dynamoctl.launch.slurm.launcher import SlurmLauncher

    srun = SlurmLauncher(job_id="7", python="/py", env={}).describe(spec)
    assert srun[2:7] == [
        "--nodes=2",
        "--ntasks-per-node=8",
        "--nodelist=n0,n1",
        "--mpi=pmix",
        "--label",
    ]
    assert srun[srun.index("--") + 1] == "trtllm-llmapi-launch"


def test_a_trtllm_gang_refuses_a_blank_its_launcher_would_split() -> None:
    text = _recipe("nodes_per_replica: 2, gpus_per_replica: 16", engine="trtllm")
    with pytest.raises(PlanError, match=r"workers.agg: '/my models/m' holds a blank"):
        _plan(text.replace("path: /m", "path: /my models/m"))


def test_trtllm_gangs_are_refused_off_slurm_naming_the_field_and_why() -> None:
    text = _recipe("nodes_per_replica: 2, gpus_per_replica: 16", engine="trtllm")
    with pytest.raises(RecipeError) as error:
        load_recipe_text(text.replace(SLURM.replace("NODES", "4"), SSH), "r.yaml")
    assert "workers.agg.nodes_per_replica" in str(error.value)
    assert "one MPI world" in str(error.value) and "only on a Slurm target" in str(error.value)


def test_trtllm_parallel_sizes_must_fill_the_gang() -> None:
    text = _recipe(
        "nodes_per_replica: 2, gpus_per_replica: 16, engine_args: {tensor-parallel-size: 8}",
        engine="trtllm",
    )
    with pytest.raises(RecipeError, match=r"engine_args.tensor-parallel-size: .*8 = 8 GPUs"):
        load_recipe_text(text, "r.yaml")


def test_an_mpi_world_node_with_another_gpu_count_is_refused() -> None:
    from dynamoctl.launch.api import LaunchError
    from dynamoctl.launch.gpus import check_gpus

    (spec,) = _plan(_recipe("nodes_per_replica: 2, gpus_per_replica: 16", engine="trtllm"))
    check_gpus("n1", 8, [spec], "target.gpus_per_node", "fix it")
    with pytest.raises(LaunchError, match=r"agg-0 \(gang agg-0, rank 0\): n1 has 4 GPU"):
        check_gpus("n1", 4, [spec], "target.gpus_per_node", "fix it")


def test_an_ssh_gang_wider_than_the_hosts_is_refused_naming_target_hosts() -> None:
    text = _recipe("nodes_per_replica: 3, gpus_per_replica: 24").replace(
        SLURM.replace("NODES", "4"), SSH
    )
    with pytest.raises(RecipeError, match=r"nodes_per_replica: 3 nodes .* has 2 \(target.hosts\)"):
        load_recipe_text(text, "r.yaml")


def test_more_gangs_than_free_nodes_is_a_plan_error_naming_nodes_per_replica() -> None:
    text = _recipe("replicas: 3, nodes_per_replica: 2, gpus_per_replica: 16")
    with pytest.raises(PlanError, match=r"workers.agg.nodes_per_replica: replica 2 needs 2 whole"):
        _plan(text)


def test_one_node_replicas_do_not_land_on_a_gangs_nodes() -> None:
    text = _recipe("nodes_per_replica: 2, gpus_per_replica: 16").replace(
        "  agg:", "  prefill: {engine: vllm, replicas: 2, gpus_per_replica: 8}\n  decode:"
    )
    recipe = load_recipe_text(text, "r.yaml")
    plan, gpu_map = build_plan(
        recipe,
        Path("/run"),
        ["n0", "n1", "n2", "n3"],
        {f"n{i}": f"192.0.2.{i + 1}" for i in range(4)},
    )
    assert [(s.name, s.host) for s in plan.instances if s.pool in ("prefill", "decode")] == [
        ("prefill-0", "n0"),
        ("prefill-1", "n1"),
        ("decode-0", "n2"),
        ("decode-0.1", "n3"),
    ]
    assert gpu_map.take(1) is None and gpu_map.take_nodes(1) is None
    gpu_map.release_node("n3")
    assert gpu_map.take_nodes(1) == [(plan.hosts[3], list(range(8)))]


def test_a_gang_member_on_a_node_with_another_gpu_count_is_refused() -> None:
    from dynamoctl.launch.api import LaunchError
    from dynamoctl.launch.gpus import check_gpus

    specs = _plan(_recipe("nodes_per_replica: 2, gpus_per_replica: 16"))
    check_gpus("n1", 8, specs, "target.gpus_per_node", "fix it")  # as declared: fine
    with pytest.raises(LaunchError, match=r"agg-0.1 \(gang agg-0, rank 1\): n1 has 12 GPU"):
        check_gpus("n1", 12, specs, "target.gpus_per_node", "fix it")


def test_sglang_parallel_sizes_must_fill_the_gang() -> None:
    text = _recipe(
        "nodes_per_replica: 2, gpus_per_replica: 16, engine_args: {tp: 8}", engine="sglang"
    )
    with pytest.raises(RecipeError, match=r"workers.agg.engine_args.tp: tp 8 = 8 GPUs but"):
        load_recipe_text(text, "r.yaml")


def test_a_stopped_mpi_world_gives_back_every_node_it_spans() -> None:
    """``scale`` reuses a stopped TensorRT-LLM gang's nodes: all of them come back, not
    only the leader's (the world is one instance with no followers)."""
    from types import SimpleNamespace

    from dynamoctl.supervisor.gang import Gangs
    from dynamoctl.supervisor.instance import Instance
    from dynamoctl.util.backoff import Backoff

    text = _recipe("replicas: 2, nodes_per_replica: 2, gpus_per_replica: 16", engine="trtllm")
    recipe = load_recipe_text(text, "r.yaml")
    allocation = [f"n{i}" for i in range(4)]
    resolve = {name: f"192.0.2.{i + 1}" for i, name in enumerate(allocation)}
    plan, gpu_map = build_plan(recipe, Path("/run"), allocation, resolve)
    first = Instance(plan.by_pool("agg")[0], Backoff())
    assert gpu_map.take_nodes(1) is None  # both worlds hold two whole nodes each
    Gangs(SimpleNamespace(instances={"agg-0": first})).release(first, gpu_map.release_node)  # type: ignore[arg-type]
    assert [host.name for host, _ in gpu_map.take_nodes(2) or []] == ["n0", "n1"]
