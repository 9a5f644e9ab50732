"""Bad recipes: every problem is reported with the file, the line and the field at fault."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dynamoctl.recipe import Recipe, RecipeError, load_recipe, load_recipe_text
from dynamoctl.recipe.discovery import EtcdDiscovery
from dynamoctl.recipe.targets import SlurmTarget, SshTarget


def issues(text: str) -> list[str]:
    """The issues of a recipe whose first line is line 1 of ``text``."""
    with pytest.raises(RecipeError) as caught:
        load_recipe_text(textwrap.dedent(text).lstrip("\n"), "bad.yaml")
    return [str(issue) for issue in caught.value.issues]


def recipe(text: str) -> Recipe:
    return load_recipe_text(textwrap.dedent(text).lstrip("\n"), "good.yaml")


MINIMAL = """
schema: 1
name: demo
model: {name: m, path: org/m}
workers:
  agg:
    engine: mocker
"""


def test_minimal_recipe_gets_documented_defaults() -> None:
    loaded = recipe(MINIMAL)
    assert loaded.namespace == "demo"
    assert loaded.discovery.backend == "embedded"
    assert loaded.discovery.lease_ttl == 10.0
    assert loaded.target.kind == "local"
    # No host: the plan picks 127.0.0.1 on a local target, the head's address elsewhere.
    assert (loaded.frontend.host, loaded.frontend.port) == (None, 8000)
    assert loaded.frontend.router.mode == "kv"
    assert loaded.frontend.router.replicas == 0
    assert loaded.model.block_size == 64
    assert loaded.workers.pools()["agg"].replicas == 1


def test_broken_yaml_reports_line_and_column() -> None:
    assert issues("""
        schema: 1
        name: demo
          model: x
        """) == ["bad.yaml:3:8: mapping values are not allowed here"]


def test_unclosed_flow_sequence_names_where_it_started() -> None:
    assert issues("""
        schema: 1
        target: {kind: ssh, hosts: [a, b}
        """) == [
        "bad.yaml:2:33: expected ',' or ']', but got '}' "
        "(while parsing a flow sequence started on line 2)"
    ]


def test_duplicate_key_is_a_yaml_error() -> None:
    [issue] = issues("""
        schema: 1
        name: a
        name: b
        """)
    assert issue.startswith('bad.yaml:3:1: found duplicate key "name"')


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_empty_file(text: str) -> None:
    assert issues(text) == ["bad.yaml:1: empty recipe; start with 'schema: 1'"]


def test_top_level_must_be_a_mapping() -> None:
    assert issues("- schema: 1\n") == ["bad.yaml:1: a recipe is a mapping of keys, got a list"]


def test_missing_schema_version() -> None:
    assert issues("""
        name: demo
        """) == ["bad.yaml:1 schema: missing required field; add 'schema: 1' at the top"]


@pytest.mark.parametrize(("value", "shown"), [("2", "2"), ('"1"', "'1'"), ("1.0", "1.0")])
def test_unsupported_schema_version_stops_before_other_checks(value: str, shown: str) -> None:
    assert issues(f"""
        name: Not_Checked
        schema: {value}
        """) == [
        f"bad.yaml:2 schema: unsupported recipe schema version {shown}; "
        "this dynamoctl reads schema 1"
    ]


def test_unknown_field_suggests_the_closest_name() -> None:
    assert issues(MINIMAL + "    replicaz: 2\n") == [
        "bad.yaml:7 workers.agg.replicaz: unknown field 'replicaz' (did you mean 'replicas'?)"
    ]


def test_unknown_field_without_a_close_name() -> None:
    assert issues(MINIMAL + "colour: blue\n") == ["bad.yaml:7 colour: unknown field 'colour'"]


def test_wrong_type_is_not_coerced() -> None:
    assert issues("""
        schema: 1
        name: demo
        model: {name: m, path: org/m, block_size: "16"}
        workers:
          agg: {engine: mocker, replicas: true}
        """) == [
        "bad.yaml:3 model.block_size: expected an integer, got '16'",
        "bad.yaml:5 workers.agg.replicas: expected an integer, got true",
    ]


def test_negative_replicas() -> None:
    assert issues("""
        schema: 1
        name: demo
        model: {name: m, path: org/m}
        workers:
          prefill:
            engine: vllm
          decode:
            engine: vllm
            replicas: -1
        """) == ["bad.yaml:9 workers.decode.replicas: must be >= 0, got -1"]


def test_unknown_engine_lists_the_valid_ones() -> None:
    assert issues("""
        schema: 1
        name: demo
        model: {name: m, path: org/m}
        workers:
          agg:
            engine: vlm
        """) == [
        "bad.yaml:6 workers.agg.engine: must be one of 'mocker', 'vllm', 'sglang', 'trtllm', "
        "got 'vlm'"
    ]


def test_unknown_router_mode_lists_the_valid_ones() -> None:
    assert issues(MINIMAL + "frontend:\n  router: {mode: kv-aware}\n") == [
        "bad.yaml:8 frontend.router.mode: must be one of 'round-robin', 'random', "
        "'least-loaded', 'power-of-two', 'kv', 'kv-approx', got 'kv-aware'"
    ]


def test_unknown_discovery_backend_points_at_the_backend_key() -> None:
    assert issues(MINIMAL + "discovery:\n  lease_ttl: 5\n  backend: consul\n") == [
        "bad.yaml:9 discovery.backend: must be one of 'embedded', 'etcd', got 'consul'"
    ]


def test_missing_target_kind_lists_the_kinds() -> None:
    assert issues(MINIMAL + "target:\n  hosts: [a]\n") == [
        "bad.yaml:7 target.kind: missing required field (one of 'local', 'ssh', 'slurm')"
    ]


def test_union_tag_does_not_leak_into_the_path() -> None:
    assert issues(MINIMAL + "target:\n  kind: ssh\n  hosts: []\n  port: 0\n") == [
        "bad.yaml:9 target.hosts: must not be empty",
        "bad.yaml:10 target.port: must be >= 1, got 0",
    ]


def test_list_items_are_located_by_index() -> None:
    assert issues(
        MINIMAL + "discovery:\n  backend: etcd\n  endpoints:\n    - http://a:2379\n"
        "    - 10.0.0.1:2379\n"
    ) == [
        "bad.yaml:11 discovery.endpoints[1]: must look like http://HOST:PORT, got '10.0.0.1:2379'"
    ]


def test_etcd_needs_endpoints_unless_managed() -> None:
    assert issues(MINIMAL + "discovery:\n  backend: etcd\n") == [
        "bad.yaml:7 discovery.endpoints: required unless managed: true "
        "(e.g. [http://10.0.0.1:2379])"
    ]
    assert recipe(MINIMAL + "discovery: {backend: etcd, managed: true}\n").discovery == (
        EtcdDiscovery(backend="etcd", managed=True)
    )


def test_lease_ttl_lower_bound() -> None:
    assert issues(MINIMAL + "discovery: {backend: embedded, lease_ttl: 1.5}\n") == [
        "bad.yaml:7 discovery.lease_ttl: must be >= 2, got 1.5"
    ]


def test_missing_field_points_at_its_parent_mapping() -> None:
    assert issues("""
        schema: 1
        name: demo
        model:
          name: m
        workers:
          agg: {engine: mocker}
        """) == ["bad.yaml:3 model.path: missing required field"]


def test_missing_top_level_field_points_at_the_first_line() -> None:
    assert issues("""
        # comment
        schema: 1
        name: demo
        model: {name: m, path: org/m}
        """) == ["bad.yaml:2 workers: missing required field"]


def test_prefill_without_decode() -> None:
    assert issues("""
        schema: 1
        name: demo
        model: {name: m, path: org/m}
        workers:
          prefill: {engine: vllm}
        """) == ["bad.yaml:5 workers.prefill: needs a decode pool (add workers.decode)"]


def test_agg_mixed_with_disaggregated_pools() -> None:
    assert issues(MINIMAL + "  decode: {engine: mocker}\n") == [
        "bad.yaml:7 workers.decode: cannot be combined with agg; use either agg or prefill + decode"
    ]


@pytest.mark.parametrize("workers", ["{}", "{agg: {engine: mocker, replicas: 0}}"])
def test_no_running_workers(workers: str) -> None:
    assert issues(f"""
        schema: 1
        name: demo
        model: {{name: m, path: org/m}}
        workers: {workers}
        """) == [
        "bad.yaml:4 workers: needs at least one pool (agg, prefill, decode) with replicas > 0"
    ]


def test_decode_alone_is_allowed() -> None:
    loaded = recipe("""
        schema: 1
        name: demo
        model: {name: m, path: org/m}
        workers:
          decode: {engine: vllm, replicas: 2}
        """)
    assert list(loaded.workers.pools()) == ["decode"]


SLURM = """
schema: 1
name: demo
discovery: {{backend: etcd, managed: true}}
target:
  kind: slurm
  partition: gpu
  nodes: 2
  gpus_per_node: 4
  time_limit: {time_limit}
model: {{name: m, path: org/m}}
workers:
  prefill: {{engine: vllm, gpus_per_replica: 4}}
  decode:
    engine: vllm
    gpus_per_replica: 8
"""


def test_slurm_replica_must_fit_on_one_node() -> None:
    assert issues(SLURM.format(time_limit="01:00:00")) == [
        "bad.yaml:15 workers.decode.gpus_per_replica: 8 GPUs per replica exceed "
        "target.gpus_per_node = 4; a replica must fit on one node"
    ]


@pytest.mark.parametrize("limit", ["4h", "1:00", "01:60:00", "1-1:00", "'-01:00:00'"])
def test_bad_time_limit(limit: str) -> None:
    [issue] = issues(SLURM.format(time_limit=limit))
    shown = limit.strip("'")
    assert issue == (
        f"bad.yaml:9 target.time_limit: must look like HH:MM:SS or D-HH:MM:SS, got '{shown}'"
    )


@pytest.mark.parametrize("limit", ["00:30:00", "4:00:00", "2-12:00:00"])
def test_good_time_limit(limit: str) -> None:
    text = SLURM.format(time_limit=limit).replace("gpus_per_replica: 8", "gpus_per_replica: 4")
    target = recipe(text).target
    assert isinstance(target, SlurmTarget)
    assert target.time_limit == limit


def test_embedded_discovery_cannot_span_hosts() -> None:
    assert issues(MINIMAL + "target: {kind: ssh, hosts: [a, b]}\n") == [
        "bad.yaml:1 discovery.backend: embedded discovery serves one host but the target spans "
        "several; use backend: etcd (with managed: true to let dynamoctl run it)"
    ]
    single = recipe(MINIMAL + "target: {kind: ssh, hosts: [a]}\n").target
    assert isinstance(single, SshTarget)


def test_every_error_in_a_file_is_reported_in_line_order() -> None:
    assert issues("""
        schema: 1
        name: Demo
        target: {kind: ssh, hosts: [a, a], prot: 2222}
        model: {name: m, tokenizer: [t]}
        frontend: {port: 80000}
        workers:
          agg: {engine: mocker, replicas: -1, env: {CUDA_VISIBLE_DEVICES: 0}}
        """) == [
        "bad.yaml:2 name: must be lowercase letters, digits and '-', start with a letter or "
        "digit and be at most 63 characters, got 'Demo'",
        "bad.yaml:3 target.hosts: lists 'a' more than once",
        "bad.yaml:3 target.prot: unknown field 'prot' (did you mean 'port'?)",
        "bad.yaml:4 model.path: missing required field",
        "bad.yaml:4 model.tokenizer: expected a string, got a list",
        "bad.yaml:5 frontend.port: must be <= 65535, got 80000",
        "bad.yaml:7 workers.agg.env.CUDA_VISIBLE_DEVICES: expected a string, got 0",
        "bad.yaml:7 workers.agg.replicas: must be >= 0, got -1",
    ]


def test_values_from_anchors_are_located() -> None:
    # A merged key has no line of its own: the merging key's line is used. An alias shares
    # its anchor's nodes, so its errors point where the anchor defines the value.
    assert issues("""
        schema: 1
        name: demo
        model: {name: m, path: org/m}
        x-pool: &pool {engine: vllm, replicas: -3}
        workers:
          prefill: {<<: *pool}
          decode: *pool
        """) == [
        "bad.yaml:4 workers.decode.replicas: must be >= 0, got -3",
        "bad.yaml:4 x-pool: unknown field 'x-pool'",
        "bad.yaml:6 workers.prefill.replicas: must be >= 0, got -3",
    ]


def test_unreadable_file(tmp_path: Path) -> None:
    absent = tmp_path / "absent.yaml"
    with pytest.raises(RecipeError) as caught:
        load_recipe(absent)
    assert str(caught.value) == f"{absent}: cannot read: No such file or directory"


def test_file_name_is_reported_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "r.yaml").write_text("schema: 1\nname: demo\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError) as caught:
        load_recipe("r.yaml")
    assert [str(i) for i in caught.value.issues] == [
        "r.yaml:1 model: missing required field",
        "r.yaml:1 workers: missing required field",
    ]


def test_required_disaggregation_with_standalone_routers() -> None:
    loaded = recipe("""
        schema: 1
        name: demo
        model: {name: m, path: org/m}
        frontend:
          router: {replicas: 2, disaggregation: required}
        workers:
          prefill: {engine: mocker}
          decode: {engine: mocker}
        """)
    assert loaded.frontend.router.replicas == 2
    assert loaded.frontend.router.disaggregation == "required"
    # Still refused without a prefill pool, standalone or not.
    assert issues("""
        schema: 1
        name: demo
        model: {name: m, path: org/m}
        frontend:
          router: {replicas: 2, disaggregation: required}
        workers:
          decode: {engine: mocker}
        """) == [
        "bad.yaml:5 frontend.router.disaggregation: required needs a prefill pool "
        "(add workers.prefill) or use auto"
    ]
