"""A pool's ``priority_scheduling`` as vLLM's own parser reads it (as ``VllmEngine``
parses its arguments): the priority policy. Needs vLLM (CPU build is enough; no engine
starts): skipped without it on a developer's machine, a failure in CI."""

from __future__ import annotations

from dynamoctl.engines.vllm import args as vargs
from tests.engines.vllm_required import require
from tests.recipe.test_priority_scheduling import arguments

require("vllm")  # a failure, not a skip, under CI

import vllm.engine.arg_utils as vllm_args  # noqa: E402


def test_vllms_parser_reads_the_priority_policy() -> None:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = vllm_args.AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    argv = vargs.engine_argv({"model": "/m", **arguments("vllm")})
    parsed = vllm_args.AsyncEngineArgs.from_cli_args(parser.parse_args(argv))
    assert parsed.scheduling_policy == "priority"
    plain = parser.parse_args(vargs.engine_argv({"model": "/m", **arguments("vllm", on=False)}))
    assert vllm_args.AsyncEngineArgs.from_cli_args(plain).scheduling_policy == "fcfs"
