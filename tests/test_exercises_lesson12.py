"""Lesson 12's checks: each accepts a right answer, explains a wrong one, judges hidden cases
only in a graded run, and leaves the verdict to the grader where the student edition lacks the
reference (course_lib.exercises.lesson12)."""

import json
import math
from dataclasses import replace

import pytest

from course_lib import planner as P
from course_lib.exercises import cases, common
from course_lib.exercises import lesson12 as ex


def fewest(model, plan, budget):
    none = P.memory(model, replace(plan, recompute=False))["total"]
    every = P.memory(model, replace(plan, recompute=True))["total"]
    if none <= budget:
        return 0
    if every > budget:
        return None
    # k >= 1 recomputed layers: a straight line from 1 (as without) to L (as with all)
    step = (none - every) / (model.layers - 1)
    return 1 + math.ceil((none - budget) / step - 1e-9)


GIB = 2**30


def test_the_reference_counts_the_recomputed_layers_working_set():
    model = P.Transformer(layers=4, hidden=64, heads=4, seq=128, vocab=100, global_batch=8)
    plan = P.Plan(dp=1, tp=1, pp=1, micro_batches=1)
    full = P.activation_bytes_per_layer(model, plan)
    kept = P.activation_bytes_per_layer(model, replace(plan, recompute=True))
    none = P.memory(model, plan)["total"]
    # k recomputed layers keep their input only; one of them is whole again in backward
    assert ex.block_recompute_bytes(model, plan, 0) == none
    assert ex.block_recompute_bytes(model, plan, 1) == pytest.approx(none)
    assert ex.block_recompute_bytes(model, plan, 3) == pytest.approx(none - 2 * (full - kept))
    assert ex.block_recompute_bytes(model, plan, 4) == pytest.approx(
        P.memory(model, replace(plan, recompute=True))["total"])
    assert ex.fewest_layers_to_recompute(model, plan, none) == 0
    assert ex.fewest_layers_to_recompute(model, plan, none - 1) == 2
    assert ex.fewest_layers_to_recompute(model, plan, 1.0) is None


def test_block_recompute_accepts_the_count_and_explains_mistakes():
    assert "correct" in ex.check_block_recompute(fewest)

    def no_working_set(model, plan, budget):  # forgets the layer being recomputed
        k = fewest(model, plan, budget)
        return k - 1 if k and k > 1 else k

    with pytest.raises(common.ExerciseFailed, match="whole activations are back"):
        ex.check_block_recompute(no_working_set)
    with pytest.raises(common.ExerciseFailed, match="recompute as few as fit"):
        ex.check_block_recompute(lambda model, plan, budget: model.layers)
    with pytest.raises(common.ExerciseFailed, match="return a number of layers"):
        ex.check_block_recompute(lambda model, plan, budget: 2.5)
    with pytest.raises(common.ExerciseFailed, match="None is for when none does"):
        ex.check_block_recompute(lambda model, plan, budget: None)


def test_block_recompute_hidden_case_only_in_a_graded_run(monkeypatch, tmp_path):
    def visible_only(model, plan, budget):  # wrong for the hidden case's vocabulary of 32,000
        k = fewest(model, plan, budget)
        return model.layers if model.vocab == 32_000 and k != model.layers else k

    assert "correct" in ex.check_block_recompute(visible_only)
    monkeypatch.setenv(common.HIDDEN_SEED, "5")
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_block_recompute(visible_only)
    data = common.from_plain(json.loads(next(tmp_path.iterdir()).read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson12.block_recompute"](data)


def test_without_the_reference_the_visible_cases_are_judged_by_their_digests(monkeypatch):
    answers = [ex.fewest_layers_to_recompute(m, p, b) for m, p, b in ex._block_cases(None)]
    assert tuple(cases.digest(a) for a in answers) == ex.BLOCK_DIGESTS
    assert len(set(answers)) == len(answers)  # four different answers, None among them

    def stripped(model, plan, budget):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "fewest_layers_to_recompute", stripped)
    assert ex.check_block_recompute(fewest).startswith("recorded: right on the 4 visible cases")
    with pytest.raises(common.ExerciseFailed, match="visible case 1 .* is not the fewest"):
        ex.check_block_recompute(lambda model, plan, budget: model.layers)


def split_stages(costs, p):  # dynamic programming over where each stage starts
    n, prefix = len(costs), [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    best = [[(prefix[j], 0) for j in range(n + 1)]]
    for k in range(2, p + 1):
        best.append([(math.inf, 0)] * k + [
            min((max(best[-1][i][0], prefix[j] - prefix[i]), i) for i in range(k - 1, j))
            for j in range(k, n + 1)])
    sizes, j = [], n
    for k in range(p, 0, -1):
        i = best[k - 1][j][1]
        sizes.append(j - i)
        j = i
    return sizes[::-1]


def by_count(costs, p):  # the planner's way: counts as even as they go, costs ignored
    q, r = divmod(len(costs), p)
    return [q + (s < r) for s in range(p)]


def test_split_stages_accepts_the_lightest_busiest_stage_and_explains_the_rest():
    assert "correct: your splits make the busiest stage" in ex.check_split_stages(split_stages)
    with pytest.raises(common.ExerciseFailed, match="9 units over 4 stages: your busiest stage, "
                                                    "stage 3, takes 4; another split"):
        ex.check_split_stages(lambda costs, p: [3, 2, 2, 2] if len(costs) == 9 else
                              split_stages(costs, p))
    with pytest.raises(common.ExerciseFailed, match="stage 3, takes 4"):
        ex.check_split_stages(by_count)
    with pytest.raises(common.ExerciseFailed, match="the stages hold 8 units"):
        ex.check_split_stages(lambda costs, p: [2] * p)
    with pytest.raises(common.ExerciseFailed, match="a list of 4 whole numbers"):
        ex.check_split_stages(lambda costs, p: [0, 3, 3, 3])


def test_the_lightest_busiest_stage_is_what_every_split_gives_at_best():
    from itertools import combinations

    for costs, p in [*ex.VISIBLE_SPLITS, ([1.5, 0.25, 2.0, 0.75, 1.0, 3.0, 0.5], 3)]:
        n = len(costs)
        edges = [(0, *cuts, n) for cuts in combinations(range(1, n), p - 1)]
        every = min(ex.busiest_stage(costs, [e[k + 1] - e[k] for k in range(p)])[1]
                    for e in edges)
        assert ex.lightest_busiest_stage(costs, p) == every


def test_split_stages_judges_hidden_costs_in_a_graded_run_and_digests_without_the_reference(
        monkeypatch):
    def right_on_visible_only(costs, p):
        visible = [c for c, _ in ex.VISIBLE_SPLITS]
        return split_stages(costs, p) if costs in visible else by_count(costs, p)

    assert "correct" in ex.check_split_stages(right_on_visible_only)
    with monkeypatch.context() as m:
        m.setenv(common.HIDDEN_SEED, "12345")
        with pytest.raises(common.HiddenTestFailed):
            ex.check_split_stages(right_on_visible_only)

    def stripped(costs, p):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "lightest_busiest_stage", stripped)  # as the student edition has it
    assert ex.check_split_stages(split_stages).startswith("correct for the visible costs")
    with pytest.raises(common.ExerciseFailed, match="your busiest stage takes 4; another split"):
        ex.check_split_stages(by_count)
