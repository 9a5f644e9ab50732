"""KvRouter: the kv cost by hand, sampling, booked load, every mode, busy detection."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.router import AllWorkersBusy, KvRouter, NoWorkers, UnknownMode, mode_names
from dynamoctl.router.policies import softmax_sample
from dynamoctl.wire.engine import LoadMetrics
from dynamoctl.wire.kv_events import BlockStored, KVEventBatch

B = 4
PROMPT = list(range(100, 116))  # 16 tokens: 4 full blocks


def router(mode: str = "kv", *workers: str, **kwargs: object) -> KvRouter:
    r = KvRouter(mode, B, seed=7, **kwargs)  # type: ignore[arg-type]
    for w in workers or ("a", "b"):
        r.add_worker(w)
    return r


def cache(r: KvRouter, worker: str, tokens: list[int]) -> None:
    """``worker`` reports ``tokens``' full blocks cached (engine hashes = ours, as the
    mocker sends)."""
    hashes = sequence_hashes(tokens, B)
    stored = BlockStored(hashes, None, tokens[: len(hashes) * B], B)
    r.apply_kv_batch(worker, KVEventBatch(0.0, [stored]))


def load(active: int = 0, queued: int = 0, waiting: int = 0, total: int = 100) -> LoadMetrics:
    return LoadMetrics(
        active_blocks=active,
        total_blocks=total,
        num_waiting=waiting,
        num_running=0,
        prefill_tokens_queued=queued,
        kv_usage=active / total,
    )


# ----------------------------------------------------------------------- kv cost by hand


def test_overlap_wins_when_idle() -> None:
    r = router()
    cache(r, "a", PROMPT[:12])  # 3 of 4 blocks
    d = r.pick(PROMPT, "r1")
    # new blocks: 4 prompt blocks + 1 private block (partial tail or first output block)
    # a: 1 * (0 + 16 - 12) / 4 + 0 + 5 = 6;  b: 16 / 4 + 0 + 5 = 9
    assert (d.worker_id, d.overlap_blocks, d.prompt_blocks, d.cost) == ("a", 3, 4, 6.0)


OTHER = list(range(500, 516))  # 4 blocks sharing nothing with PROMPT


@pytest.mark.parametrize(("alpha", "winner", "cost"), [(1.0, "b", 9.0), (2.0, "a", 12.0)])
def test_load_overrides_overlap_unless_alpha_says_otherwise(
    alpha: float, winner: str, cost: float
) -> None:
    r = router(overlap_weight=alpha)
    cache(r, "a", PROMPT[:12])
    r.pick(OTHER, "x", exclude={"b"})  # a decoding request on a: 4 + 1 blocks
    r.on_first_token("x")
    # a: alpha * 4/4 + 5 + 5 = alpha + 10;  b: alpha * 16/4 + 0 + 5 = 4 alpha + 5
    d = r.pick(PROMPT, "r1")
    assert (d.worker_id, d.cost) == (winner, cost)


def test_booked_prefill_counts_until_the_first_token() -> None:
    r = router()
    cache(r, "a", PROMPT[:12])
    r.pick(OTHER, "x", exclude={"b"})  # 16 tokens waiting for prefill on a
    # a: (16 + 4) / 4 + 5 + 5 = 15;  b: 16 / 4 + 0 + 5 = 9
    assert r.pick(PROMPT, "r1").worker_id == "b"
    r.on_finished("r1")
    r.on_first_token("x")
    # a: 4 / 4 + 5 + 5 = 11;  b: 9 (still b: x's blocks stay booked until it finishes)
    assert r.pick(PROMPT, "r2").worker_id == "b"
    r.on_finished("r2")
    r.on_finished("x")
    assert r.pick(PROMPT, "r3").worker_id == "a"  # a: 4 / 4 + 0 + 5 = 6


def test_reported_load_does_not_enter_the_kv_cost() -> None:
    """Reports lag: a worker that just finished must not look loaded to the next turn."""
    r = router()
    cache(r, "a", PROMPT[:12])
    r.update_load("a", load(active=50, queued=400))
    assert r.pick(PROMPT, "r1").worker_id == "a"


def test_ties_go_to_the_smaller_tree() -> None:
    for seed in range(20):
        r = KvRouter("kv", B, seed=seed)
        for w in ("a", "b", "c"):
            r.add_worker(w)
        cache(r, "a", [900 + i for i in range(12)])  # unrelated blocks
        cache(r, "c", [800 + i for i in range(4)])
        assert r.pick(PROMPT, "r").worker_id == "b"


def test_burst_of_identical_prompts_spreads_over_workers() -> None:
    """Booked load feeds back at once: no first tokens yet, no load reports."""
    r = router("kv", "a", "b", "c", "d")
    picks = Counter(r.pick(PROMPT, f"r{i}").worker_id for i in range(8))
    assert picks == {"a": 2, "b": 2, "c": 2, "d": 2}


def test_burst_on_a_cached_prompt_leaves_the_cached_worker_once_it_is_loaded() -> None:
    r = router("kv", "a", "b", "c", "d")
    cache(r, "a", PROMPT)
    picks = [r.pick(PROMPT, f"r{i}").worker_id for i in range(12)]
    assert picks[0] == "a" and len(set(picks)) >= 3


def test_booked_load_is_released_on_first_token_and_finish() -> None:
    r = router()
    r.pick([*PROMPT, 1, 2], "r1")  # 18 tokens: 4 full blocks + its private one
    w = r.load.booking("r1")
    assert w is not None
    assert (r.load.prefill_tokens(w.worker_id), r.load.active_blocks(w.worker_id)) == (18, 5)
    r.on_first_token("r1")
    assert (r.load.prefill_tokens(w.worker_id), r.load.active_blocks(w.worker_id)) == (0, 5)
    r.on_finished("r1")
    r.on_finished("r1")  # idempotent
    assert (r.load.prefill_tokens(w.worker_id), r.load.active_blocks(w.worker_id)) == (0, 0)


def test_shared_blocks_are_booked_once() -> None:
    r = router("kv", "a")
    r.pick(PROMPT, "r1")
    r.pick([*PROMPT[:8], 7, 7, 7, 7], "r2")  # shares 2 of its 3 blocks with r1
    assert r.load.active_blocks("a") == (4 + 1) + (1 + 1)  # full + private of each
    r.on_finished("r1")
    assert r.load.active_blocks("a") == 3 + 1


def test_rebooking_a_request_id_releases_the_first_booking() -> None:
    r = router("round-robin")
    first = r.pick(PROMPT, "r1").worker_id
    second = r.pick(PROMPT, "r1").worker_id  # a retry
    assert first != second
    assert r.load.prefill_tokens(first) == 0 and len(r.load) == 1


# ----------------------------------------------------------------------- temperature


def test_softmax_sampling_follows_normalised_costs() -> None:
    rng = random.Random(1)
    logits, t = [10.0, 15.0, 20.0], 0.5
    counts = Counter(softmax_sample(logits, t, rng) for _ in range(20_000))
    weights = [math.exp(-x / t) for x in (0.0, 0.5, 1.0)]
    for i, w in enumerate(weights):
        assert counts[i] / 20_000 == pytest.approx(w / sum(weights), abs=0.02)
    # Equal costs: uniform. Scale-free: costs x100 give the same distribution.
    assert len({softmax_sample([3.0, 3.0], t, rng) for _ in range(50)}) == 2
    scaled = Counter(softmax_sample([1000.0, 1500.0, 2000.0], t, rng) for _ in range(20_000))
    assert scaled[0] / 20_000 == pytest.approx(weights[0] / sum(weights), abs=0.02)


def test_temperature_spreads_picks_but_favours_the_cheapest() -> None:
    r = router("kv", "a", "b", temperature=1.0)
    cache(r, "a", PROMPT)
    picks = Counter()
    for i in range(400):
        picks[r.pick(PROMPT, f"r{i}").worker_id] += 1
        r.on_finished(f"r{i}")
    assert picks["a"] > picks["b"] > 0


# ----------------------------------------------------------------------- modes


def test_unknown_mode_lists_valid_ones() -> None:
    with pytest.raises(UnknownMode) as err:
        KvRouter("nearest", B)
    for name in ("round-robin", "random", "least-loaded", "power-of-two", "kv", "kv-approx"):
        assert name in str(err.value)
    assert set(mode_names()) >= {"kv", "kv-approx", "round-robin"}


def test_round_robin_cycles() -> None:
    r = router("round-robin", "a", "b", "c")
    assert [r.pick(PROMPT, f"r{i}").worker_id for i in range(6)] == ["a", "b", "c"] * 2


def test_random_reaches_every_worker_and_is_seeded() -> None:
    picks = [router("random", "a", "b", "c").pick(PROMPT, "r").worker_id for _ in range(3)]
    assert len(set(picks)) == 1  # same seed, same choice
    r = router("random", "a", "b", "c")
    assert {r.pick(PROMPT, f"r{i}").worker_id for i in range(60)} == {"a", "b", "c"}


def test_least_loaded_avoids_load_booked_or_reported() -> None:
    r = router("least-loaded", "a", "b", "c")
    r.update_load("c", load(active=50))
    picks = Counter(r.pick(PROMPT, f"r{i}").worker_id for i in range(6))
    assert picks == {"a": 3, "b": 3}


def test_power_of_two_never_picks_the_most_loaded() -> None:
    r = router("power-of-two", "a", "b", "c", "d")
    r.update_load("d", load(active=90))
    picks = set()
    for i in range(100):
        picks.add(r.pick(PROMPT, f"r{i}").worker_id)
        r.on_finished(f"r{i}")
    assert picks == {"a", "b", "c"}


def test_kv_approx_learns_from_its_own_decisions_until_ttl() -> None:
    now = [0.0]
    r = KvRouter("kv-approx", B, seed=3, approx_ttl=30.0, clock=lambda: now[0])
    for w in ("a", "b", "c"):
        r.add_worker(w)
    assert not r.wants_kv_events
    first = r.pick(PROMPT, "r1")
    r.on_finished("r1")
    follow = r.pick(PROMPT + list(range(16)), "r2")  # the next turn of the conversation
    assert (follow.worker_id, follow.overlap_blocks) == (first.worker_id, 4)
    r.on_finished("r2")
    now[0] = 100.0
    assert r.pick(PROMPT, "r3").overlap_blocks == 0


def test_non_kv_modes_still_report_known_overlap() -> None:
    r = router("round-robin")
    cache(r, "b", PROMPT)
    assert [
        (d.worker_id, d.overlap_blocks) for d in (r.pick(PROMPT, "1"), r.pick(PROMPT, "2"))
    ] == [
        ("a", 0),
        ("b", 4),
    ]


# ----------------------------------------------------------------------- busy, empty


def test_all_workers_busy_raises_typed_error() -> None:
    r = router("kv", "a", "b", busy_kv_usage=0.9, busy_waiting=4)
    r.update_load("a", load(active=95))
    r.update_load("b", load(waiting=5))
    with pytest.raises(AllWorkersBusy) as err:
        r.pick(PROMPT, "r1")
    assert err.value.busy == 2
    r.update_load("b", load(waiting=4))  # at the threshold is not over it
    assert r.pick(PROMPT, "r2").worker_id == "b"


def test_headroom_lowers_the_busy_thresholds_for_one_pick() -> None:
    r = router("kv", "a", busy_kv_usage=0.8, busy_waiting=10)
    r.update_load("a", load(active=75))  # under 0.8, over 0.8 x (1 - 0.1)
    with pytest.raises(AllWorkersBusy):
        r.pick(PROMPT, "batch", headroom=0.1)
    assert r.pick(PROMPT, "chat").worker_id == "a"
    r.update_load("a", load(waiting=9))  # under 10, over 10 x (1 - 0.2)
    assert r.is_busy("a", 0.2) and not r.is_busy("a")


def test_headroom_counts_the_requests_own_blocks() -> None:
    """A class with headroom may not cross into it with its own prompt: 50 % used plus
    its 5 blocks (16 tokens in blocks of 4, and a private one) of 20 pass 0.8 x 0.9; a
    request without headroom is measured as before, and an idle worker takes any."""
    r = router("kv", "a", busy_kv_usage=0.8)
    r.update_load("a", load(active=10, total=20))
    assert not r.is_busy("a", 0.1)  # 50 % alone is under 72 %
    with pytest.raises(AllWorkersBusy):
        r.pick(PROMPT, "batch", headroom=0.1)  # 75 % with its own blocks
    assert r.pick(PROMPT, "chat").worker_id == "a"
    r.on_finished("chat")
    r.update_load("a", load(active=0, total=20))
    assert r.pick(list(range(100, 164)), "long", headroom=0.1).worker_id == "a"  # 17 of 20


def test_booked_blocks_make_a_worker_busy_before_it_reports() -> None:
    r = router("round-robin", "a", busy_kv_usage=0.5)
    r.update_load("a", load(total=10))
    r.pick(list(range(24)), "r1")  # 6 + 1 blocks of 10 booked
    with pytest.raises(AllWorkersBusy):
        r.pick(PROMPT, "r2")
    r.on_finished("r1")
    assert r.pick(PROMPT, "r3").worker_id == "a"


def test_busy_kv_usage_one_never_marks_a_worker_busy() -> None:
    # Bookings of queued requests pass the whole cache: with 1 ("never", as the settings
    # say) the worker holding the prompt keeps getting it instead of AllWorkersBusy.
    r = router("kv", "a", "b", busy_kv_usage=1.0)
    cache(r, "a", PROMPT)
    r.update_load("a", load(total=10))
    r.update_load("b", load(total=10))
    for i in range(4):  # 4 x 5 blocks booked on "a": twice its cache
        assert r.pick(PROMPT, f"r{i}").worker_id == "a"
    assert r.busy_kv_usage is None and not r.is_busy("a")


def test_no_workers_and_exclusions() -> None:
    with pytest.raises(NoWorkers):
        KvRouter("kv", B).pick(PROMPT, "r")
    r = router("kv", "a", "b")
    assert r.pick(PROMPT, "r", exclude={"a"}).worker_id == "b"
    with pytest.raises(NoWorkers):
        r.pick(PROMPT, "r", exclude={"a", "b"})


def test_removing_a_worker_drops_its_state() -> None:
    r = router("kv", "a", "b")
    cache(r, "a", PROMPT)
    r.pick(PROMPT, "r1")
    r.remove_worker("a")
    assert r.workers() == ["b"] and r.find_matches(PROMPT) == {}
    r.on_finished("r1")  # its booking went with it: a no-op
    r.add_worker("a")
    assert r.load.active_blocks("a") == 0 and r.find_matches(PROMPT) == {}
