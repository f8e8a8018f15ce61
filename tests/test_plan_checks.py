"""Which plans train_gpt runs exactly (course_lib.plan_checks): one set of rules for train_gpt,
its command line and the planner's torchrun command."""

import pytest

from course_lib import plan_checks as C
from course_lib.plans import Plan

SHAPE = dict(global_batch=12, layers=4, heads=4)


def test_a_plan_is_given_as_a_plan_or_as_its_fields():
    assert C.plan_of(dp=2, zero=1) == Plan(dp=2, tp=1, pp=1, zero=1)
    plan = Plan(dp=1, tp=2, pp=2, micro_batches=2)
    assert C.plan_of(plan) is plan
    with pytest.raises(ValueError, match="not both"):
        C.plan_of(plan, dp=2)
    with pytest.raises(TypeError, match="unknown plan fields \\['chunk'\\]"):
        C.plan_of(chunk=2)
    with pytest.raises(TypeError, match="must be a course_lib.plans.Plan, got dict"):
        C.plan_of(dict(dp=2))


@pytest.mark.parametrize("change, word", [
    (dict(sequence_parallel=True, tp=2, dp=1), "sequence parallelism"),
    (dict(pp=2, dp=1, micro_batches=4, chunks=2), "interleaving"),
    (dict(pp=2, dp=1, micro_batches=2, stages=(1, 3)), "uneven stages"),
    (dict(attention="recomputed"), "selective recomputation"),
])
def test_what_train_gpt_does_not_run_is_named(change, word):
    plan = Plan(**{"dp": 2, "tp": 1, "pp": 1, **change})
    assert word in C.not_supported(plan)
    with pytest.raises(ValueError, match=f"train_gpt does not run {word}"):
        C.check_plan(2, plan, **SHAPE)


def test_a_plan_that_runs_is_returned_and_attention_is_free():
    plan = Plan(dp=2, tp=1, pp=1, attention="flash")
    assert C.not_supported(plan) == [] and C.check_plan(2, plan, **SHAPE) is plan
    assert C.check_plan(4, dp=2, tp=2, **SHAPE) == Plan(dp=2, tp=2, pp=1)


def test_a_run_with_nothing_to_do_is_refused():
    C.check_run(1, 1)
    with pytest.raises(ValueError, match="steps must be at least 1, got 0"):
        C.check_run(0, 4)
    with pytest.raises(ValueError, match="at least one sequence, got 0"):
        C.check_run(3, 0)
