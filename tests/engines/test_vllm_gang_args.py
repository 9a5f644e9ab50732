"""The commands the plan renders for a vLLM gang are accepted by vLLM's own parsers: the
leader's engine arguments by ``AsyncEngineArgs`` (as ``VllmEngine`` parses them), each
follower's by ``vllm serve``'s parser (which owns ``--headless``). Needs vLLM (CPU build
is enough; no engine starts): skipped without it on a developer's machine, a failure in
CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamoctl.plan.build import build_plan
from dynamoctl.recipe.loader import load_recipe
from dynamoctl.wire.engine_args import parse_engine_args
from tests.engines.vllm_required import require
from tests.supervisor.conftest import REPO

require("vllm")  # a failure, not a skip, under CI
# vLLM is imported in the tests, not here: its import (torch's with it) took 26 s of each
# pytest-xdist worker's collection on a loaded 2-core machine, for two tests on one worker.

pytestmark = pytest.mark.gang


@pytest.mark.parametrize(
    ("recipe", "nodes"), [("vllm-tp16-2node", 2), ("deepseek-r1-wide-ep", 6)], ids=str
)
def test_vllm_parses_every_members_rendered_command(recipe: str, nodes: int) -> None:
    import vllm.engine.arg_utils as vllm_args
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    loaded = load_recipe(REPO / "recipes" / f"{recipe}.yaml")
    names = [f"gpu{i}" for i in range(nodes)]
    plan, _ = build_plan(
        loaded, Path("/run"), names, {n: f"192.0.2.{i + 1}" for i, n in enumerate(names)}
    )
    members = [spec for spec in plan.instances if spec.gang]
    assert {spec.rank for spec in members} == set(range(max(s.nnodes for s in members)))
    for spec in members:
        if spec.rank == 0:  # what VllmEngine hands AsyncEngineArgs
            argv = spec.argv[spec.argv.index("--role") + 2 :]
            parser = vllm_args.AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
        else:  # `vllm serve` ARGS, as the follower parses them (engines/vllm/gang.py)
            argv = spec.argv[spec.argv.index("--") + 1 :]
            parser = make_arg_parser(FlexibleArgumentParser())
        parsed = parser.parse_args(argv)
        options = parse_engine_args(argv)
        if "nnodes" in options:
            assert (parsed.nnodes, parsed.node_rank) == (spec.nnodes, spec.rank)
            assert parsed.master_addr == "192.0.2.1"
        else:
            assert parsed.data_parallel_size_local * spec.nnodes == parsed.data_parallel_size
            assert (
                parsed.data_parallel_start_rank == spec.rank * parsed.data_parallel_size_local
                or spec.rank == 0
            )
        assert bool(getattr(parsed, "headless", False)) == (spec.rank > 0)
