"""Which plans train_gpt runs exactly (course_lib.plan_checks): one set of rules for train_gpt,
its command line and the planner's torchrun command."""

import itertools
import re

import pytest

from course_lib import plan_checks as C
from course_lib import planner, plans
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
    for steps in (2.5, True):
        with pytest.raises(ValueError, match=f"steps must be at least 1, got {steps!r} .a whole"):
            C.check_run(steps, 4)
    for shape in (dict(SHAPE, global_batch=-4), dict(SHAPE, heads=0), dict(SHAPE, layers=2.0)):
        with pytest.raises(ValueError, match=r"train_gpt\.\w+ must be a positive whole number"):
            C.check_plan(2, Plan(dp=2, tp=1, pp=1), **shape)


RULES = dict(layers=6, heads=4, global_batch=12)


@pytest.mark.parametrize("fields, reason", [
    (dict(dp=1, tp=3, pp=1), "tp = 3 must divide the 4 heads"),
    (dict(dp=1, tp=1, pp=8, micro_batches=12), "pp = 8 is more than the 6 layers"),
    (dict(dp=1, tp=1, pp=4, micro_batches=4), "pp = 4 does not divide the 6 layers"),
    (dict(dp=1, tp=1, pp=2, micro_batches=2, stages=(2, 3)), r"hold 5 layers, the model has 6"),
    (dict(dp=5, tp=1, pp=1), "the global batch 12 must split into dp x micro_batches = 5"),
    (dict(dp=1, tp=1, pp=3, micro_batches=2), "micro_batches = 2 < pp = 3"),
    (dict(dp=1, tp=1, pp=2, micro_batches=2, zero=3), "ZeRO-3 \\(FSDP\\) with pipeline"),
    (dict(dp=1, tp=1, pp=1, sequence_parallel=True), "it needs tp > 1"),
    (dict(dp=1, tp=1, pp=1, recompute=True, attention="recomputed"), "not both"),
    (dict(dp=1, tp=1, pp=2, micro_batches=3, chunks=3), "a multiple of pp = 2, got 3"),
    (dict(dp=1, tp=1, pp=2, micro_batches=2, chunks=2), r"\(3, 3\) layers per stage do not"),
])
def test_each_conflict_of_a_plan_with_its_model_is_named(fields, reason):
    conflicts = C.plan_conflicts(Plan(**fields), **RULES)
    assert len(conflicts) == 1 and re.search(reason, conflicts[0]), conflicts
    if not C.not_supported(Plan(**fields)):  # train_gpt refuses it with the same words
        with pytest.raises(ValueError, match=reason):
            C.check_plan(Plan(**fields).gpus, Plan(**fields), **RULES)


def test_key_value_heads_and_uneven_stages_that_fit_are_no_conflict():
    assert C.plan_conflicts(Plan(1, 2, 1), **RULES, kv_heads=2) == []
    assert "2 key/value heads" in C.plan_conflicts(Plan(1, 4, 1), **RULES, kv_heads=2)[0]
    assert C.plan_conflicts(Plan(1, 1, 4, micro_batches=4, stages=(1, 2, 2, 1)), **RULES) == []
    assert C.plan_conflicts(Plan(1, 1, 2, micro_batches=4, chunks=3), **RULES) == []


def test_the_planner_keeps_exactly_the_plans_of_its_search_without_a_conflict():
    model = plans.Transformer(layers=6, hidden=64, heads=4, seq=16, vocab=32, global_batch=12,
                              kv_heads=2)
    cluster = plans.Cluster(gpus_per_node=4, nodes=2, memory=1e9, peak_flops=1e12,
                            intra_bandwidth=1e9, inter_bandwidth=1e8)
    found = planner.candidate_plans(model, cluster, gather_units=("block", "matrix"))
    assert len(found) == len(set(found)) > 100
    sizes, rules = (1, 2, 4, 8, 16, 32), dict(layers=6, heads=4, global_batch=12, kv_heads=2)
    expected = set()
    for tp, pp in itertools.product((1, 2, 4), (1, 2, 4, 8)):
        dp = 8 // (tp * pp)
        if dp < 1 or dp * tp * pp != 8:
            continue
        stages = planner.balanced_stages(6, pp) if 6 % pp and pp <= 6 else None
        for zero, m, full, attn, sp, v, unit in itertools.product(
                range(4), range(1, 13), (False, True), plans.ATTENTION, (False, True),
                (1, 2, 3, 4, 6, 8), plans.GATHER_UNITS):
            if (12 % (dp * m) or 12 // (dp * m) not in sizes or (zero and dp == 1)
                    or (v > 1 and pp == 1) or (unit == "matrix" and zero != 3)):
                continue
            plan = Plan(dp, tp, pp, zero, m, full, attn, sp, v, stages, unit)
            if not C.plan_conflicts(plan, **rules):
                expected.add(plan)
    assert set(found) == expected
