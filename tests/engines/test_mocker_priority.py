"""The mocker's priority scheduling (``scheduling_policy: priority``, as vLLM's): its
waiting queue by priority then arrival, and the running request of the lowest priority
preempted when blocks run out; ``fcfs`` keeps arrival order."""

from __future__ import annotations

import pytest

from dynamoctl.engines.api import GenerateRequest
from dynamoctl.engines.mocker import MockerConfig
from dynamoctl.engines.mocker.scheduler import Scheduler


@pytest.mark.parametrize(
    ("policy", "order"),
    [("priority", ["c", "d", "b", "e"]), ("fcfs", ["b", "c", "d", "e"])],
)
def test_waiting_requests_are_admitted_by_priority(policy: str, order: list[str]) -> None:
    sched = Scheduler(MockerConfig(block_size=4, num_gpu_blocks=64, max_num_seqs=1,
                                   scheduling_policy=policy))  # type: ignore[arg-type]  # fmt: skip
    sched.add(GenerateRequest("a", [1, 2, 3], 2))
    plan = sched.schedule()  # a runs; the others queue behind it
    sched.finish_step(plan)
    for rid, priority in (("b", 0), ("c", 5), ("d", 5), ("e", -1)):
        sched.add(GenerateRequest(rid, [1, 2, 3], 2, priority=priority))
    admitted = ["a"]
    while sched.has_work():
        plan = sched.schedule()
        admitted += [s.request_id for s, _ in plan.scheduled if s.request_id not in admitted]
        sched.finish_step(plan)
        sched.check_invariants()
    assert admitted == ["a", *order]


@pytest.mark.parametrize(("policy", "preempted"), [("priority", "low"), ("fcfs", "high")])
def test_blocks_short_preempt_the_lowest_priority(policy: str, preempted: str) -> None:
    """``low`` is admitted a step before ``high``; both fill the pool. When ``low``
    needs a third block, first come first served preempts the last admitted (``high``),
    the priority policy the lowest priority (``low`` itself)."""
    sched = Scheduler(MockerConfig(block_size=2, num_gpu_blocks=4,
                                   scheduling_policy=policy))  # type: ignore[arg-type]  # fmt: skip
    sched.add(GenerateRequest("low", [1, 2, 3], 4, priority=0))
    sched.finish_step(sched.schedule())
    sched.add(GenerateRequest("high", [4, 5, 6], 4, priority=5))
    sched.finish_step(sched.schedule())  # both hold 2 blocks: the pool is full
    plan = sched.schedule()
    assert plan.num_preempted == 1
    assert [s.request_id for s in sched.waiting] == [preempted]
    sched.finish_step(plan)
    sched.check_invariants()
