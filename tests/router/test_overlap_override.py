"""``KvRouter.pick(overlap_weight=0)``: a disaggregated decode gets no overlap credit."""

from __future__ import annotations

from tests.router.test_router import OTHER, PROMPT, cache, router


def test_overlap_weight_zero_ignores_the_cache_and_follows_decode_load() -> None:
    r = router()
    cache(r, "a", PROMPT)  # a caches the whole prompt...
    r.pick(OTHER[:4], "busy-on-a", exclude={"b"})  # ...and holds 2 blocks of another
    assert r.pick(PROMPT, "kv").worker_id == "a"  # with credit: the cache wins
    r.on_finished("kv")
    d = r.pick(PROMPT, "decode", overlap_weight=0.0)
    # alpha 0: only decode blocks count (a: 2 + 5, b: 0 + 5); with credit a: 0 + 7, b: 4 + 5.
    assert d.worker_id == "b" and d.cost == 5.0
