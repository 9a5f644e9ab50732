"""The profile sweep's arithmetic and rules, without a deployment: the steady decode
window, the options, which pool a profile is of, and when a deployment can be profiled."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from dynamoctl.bench.client import RequestRecord
from dynamoctl.cli.profile import one_replica_each
from dynamoctl.planner.perf import check_profile, load_profile
from dynamoctl.planner.sweep import ProfileOptions, pool_identity, steady_itl
from dynamoctl.recipe import load_recipe_text

pytestmark = pytest.mark.planner


def _record(start: float, times: list[float], tokens: int | None = None) -> RequestRecord:
    """A request sent at ``start`` whose chunks arrived at ``times`` (absolute)."""
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return RequestRecord(
        session=0,
        turn=0,
        start=start,
        ttft=times[0] - start,
        gaps=gaps,
        output_tokens=tokens or len(times),
    )


def test_steady_itl_counts_only_while_every_request_decodes() -> None:
    # Request a decodes every 10 ms from 0.1 s; b's prefill ends at 0.2 s. Before that, a
    # alone ran 5 ms steps (what a batch of one does): they must not count.
    a = [0.1 + 0.005 * i for i in range(20)] + [0.2 + 0.01 * i for i in range(1, 31)]
    b = [0.2 + 0.01 * i for i in range(40)]
    assert steady_itl([_record(0.0, a), _record(0.0, b)]) == pytest.approx(0.01)


def test_steady_itl_holds_for_bursts_and_merged_chunks() -> None:
    # Tokens every 10 ms, delivered four at a time (gaps 0, 0, 0, 40 ms): the median gap
    # would say 0.
    burst = [0.04 * (i // 4) for i in range(1, 41)]
    assert steady_itl([_record(0.0, burst)]) == pytest.approx(0.01, rel=0.15)
    # Two tokens per chunk, a chunk every 20 ms: 10 ms per token.
    merged = [0.02 * i for i in range(1, 21)]
    assert steady_itl([_record(0.0, merged, tokens=40)]) == pytest.approx(0.01, rel=0.1)


def test_steady_itl_is_none_when_the_batch_never_decoded_together() -> None:
    a = [0.1, 0.11, 0.12]
    b = [0.5, 0.51, 0.52]
    assert steady_itl([_record(0.0, a), _record(0.0, b)]) is None


def test_options_sort_and_refuse() -> None:
    plan = ProfileOptions(isl="512,128,512", batches="8,1", contexts="2048").plan()
    assert (plan.isl, plan.batches, plan.contexts) == ((128, 512), (1, 8), (2048,))
    assert plan.decode_prompt(2048) == 2048 - 16
    with pytest.raises(ValidationError, match="each >= 1"):
        ProfileOptions(isl="0,128")
    with pytest.raises(ValidationError, match="context 10 leaves no prompt with --osl 64"):
        ProfileOptions(contexts="10", osl=64)


RECIPE = """\
schema: 1
name: p
model: {{name: m, path: m}}
workers:
{pools}
"""


def test_a_profile_is_of_the_agg_pool_else_decode() -> None:
    agg = load_recipe_text(RECIPE.format(pools="  agg: {engine: mocker}"), "p.yaml")
    assert pool_identity(agg, "")[0] == "agg"
    assert pool_identity(agg, "")[1].engine == "mocker"
    disagg = load_recipe_text(
        RECIPE.format(
            pools="  prefill: {engine: vllm, gpus_per_replica: 2}\n  decode: {engine: vllm}"
        ),
        "p.yaml",
    )
    name, identity = pool_identity(disagg, "")
    assert (name, identity.engine, identity.gpus_per_replica, identity.model) == (
        "decode", "vllm", 1, "m",
    )  # fmt: skip
    assert pool_identity(disagg, "prefill")[1].gpus_per_replica == 2
    with pytest.raises(ValueError, match="no worker pool 'agg' \\(pools: prefill, decode\\)"):
        pool_identity(disagg, "agg")


def test_one_ready_replica_per_pool() -> None:
    one = [("agg-0", "agg", "READY", 0), ("agg-1", "agg", "STOPPED", 0)]
    assert one_replica_each(one, "agg") is None
    gang = [("agg-0", "agg", "READY", 0), ("agg-0.1", "agg", "READY", 1)]
    assert one_replica_each(gang, "agg") is None  # a gang's follower is not a replica
    assert "pool agg has no ready replica" in str(one_replica_each([], "agg"))
    two = [("decode-0", "decode", "READY", 0), ("prefill-0", "prefill", "READY", 0),
           ("prefill-1", "prefill", "READY", 0)]  # fmt: skip
    assert one_replica_each(two, "decode") == (
        "a profile is of one replica, and pool prefill has 2 ready (prefill-0, prefill-1): "
        "`dynamoctl scale prefill=1` first"
    )


def test_the_profile_docs_planner_md_shows_is_one_the_planner_reads() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    found = re.search(r"```json\n(.*?)```", text, re.S)
    assert found is not None
    profile = load_profile(found.group(1).encode())
    check_profile(profile, model="mock-llama", engine="mocker", gpus_per_replica=0)
