"""``dynamoctl profile`` against a mocker deployment on the real clock: the profile it
writes agrees with the mocker's own timing model (engines/mocker/timing.py), so the sweep
measures what it says it measures; and what it refuses."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dynamoctl.engines.mocker.timing import TimingModel
from dynamoctl.planner.perf import ProfileError, check_profile, load_profile
from tests.supervisor.conftest import Cli, free_port, mocker_recipe

pytestmark = [pytest.mark.planner, pytest.mark.timeout(180)]

BLOCKS, BLOCK_SIZE = 256, 16  # a small KV cache, so ITL moves with batch and context
OSL = 32
RELATIVE, ABSOLUTE = 0.15, 0.004
"""ITL tolerance: 15% of the model's step plus 4 ms (timer jitter on a loaded 2-core
machine)."""
PREFILL_OVERHEAD = 0.025
"""A TTFT is the model's prefill plus the request's way through the frontend (parsing a
few thousand token ids, routing, the first chunk back): up to this much on a loaded
2-core machine, measured 2 to 17 ms. Never less than the model's prefill."""


def _recipe(cli: Cli) -> Path:
    text = mocker_recipe("prof", free_port(), replicas=1).replace(
        "num-gpu-blocks: 1024, speedup-ratio: 10", f"num-gpu-blocks: {BLOCKS}, speedup-ratio: 1"
    )
    assert f"num-gpu-blocks: {BLOCKS}" in text
    return cli.recipe(text)


def _expected_itl(batch: int, context: int) -> float:
    """The timing model's decode step at the KV usage of ``batch`` requests holding
    ``context`` tokens each (whole blocks)."""
    usage = batch * math.ceil(context / BLOCK_SIZE) / BLOCKS
    return TimingModel().decode_ms(usage) / 1e3


def _close(measured: float, expected: float) -> bool:
    return abs(measured - expected) <= RELATIVE * expected + ABSOLUTE


def _prefill_close(measured: float, expected: float) -> bool:
    return (1 - RELATIVE) * expected <= measured <= (1 + RELATIVE) * expected + PREFILL_OVERHEAD


def test_profile_of_the_mocker_matches_its_timing_model(cli: Cli) -> None:
    recipe = _recipe(cli)
    up = cli("up", str(recipe), "--detach", timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    out = cli.tmp / "profile.json"
    done = cli(
        "profile", str(recipe), "--out", str(out), "--isl", "64,1024,3000",
        "--batch", "1,4,8", "--context", "128,448", "--osl", str(OSL), "--repeats", "3",
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"wrote {out} (3 prefill, 6 decode points)" in done.stdout

    profile = load_profile(out)
    assert (profile.model, profile.engine, profile.gpus_per_replica) == ("mock-llama", "mocker", 0)
    check_profile(profile, model="mock-llama", engine="mocker", gpus_per_replica=0)
    with pytest.raises(ProfileError, match="engine 'mocker' \\(the pool's is 'vllm'\\)"):
        check_profile(profile, model="mock-llama", engine="vllm", gpus_per_replica=0)

    timing = TimingModel()
    prefill = [
        (f"prefill ISL {p.isl}", p.seconds, timing.prefill_ms(p.isl) / 1e3) for p in profile.prefill
    ]
    decode = [
        (f"decode b={d.batch} context {d.context}", d.itl, _expected_itl(d.batch, d.context))
        for d in profile.decode
    ]
    text = "\n".join(f"{what}: measured {m * 1e3:.2f} ms, model {e * 1e3:.2f} ms"
                     for what, m, e in prefill + decode)  # fmt: skip
    print("\n" + text)
    assert all(_prefill_close(m, e) for _, m, e in prefill), text
    assert all(_close(m, e) for _, m, e in decode), text
    # The model's range is covered: ITL at batch 8 of 448 tokens is several times batch 1's.
    itl = {(d.batch, d.context): d.itl for d in profile.decode}
    assert itl[(8, 448)] > 3 * itl[(1, 128)], itl

    # A profile is of one replica: with two, it refuses and says what to do.
    scaled = cli("scale", "agg=2", timeout=60)
    assert scaled.returncode == 0, scaled.stderr
    refused = cli("profile", str(recipe), "--out", str(cli.tmp / "two.json"), timeout=60)
    assert refused.returncode == 1
    assert "pool agg has 2 ready (agg-0, agg-1): `dynamoctl scale agg=1` first" in refused.stderr
    assert not (cli.tmp / "two.json").exists()


def test_profile_refuses_what_it_cannot_measure(cli: Cli) -> None:
    recipe = _recipe(cli)
    stopped = cli("profile", str(recipe))
    assert stopped.returncode == 1
    assert "deployment prof is not started: start it with `dynamoctl up -d RECIPE`" in (
        stopped.stderr
    )
    pool = cli("profile", str(recipe), "--pool", "prefill")
    assert pool.returncode == 2 and "no worker pool 'prefill' (pools: agg)" in pool.stderr
    short = cli("profile", str(recipe), "--context", "8", "--osl", "32")
    assert short.returncode == 2 and "context 8 leaves no prompt with --osl 32" in short.stderr
    bad = cli("profile", str(recipe), "--batch", "1,x")
    assert bad.returncode == 2 and "comma-separated whole numbers" in bad.stderr
