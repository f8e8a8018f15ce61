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


def stages(model, plan):
    p, m = plan.pp, plan.micro_batches
    tokens = model.seq * model.global_batch / (plan.dp * m)
    h, t = model.hidden, plan.tp
    layer = tokens * (4 * h + 4 + (12 * h + model.heads) / t) * model.value_bytes
    head = tokens * (2 * h + 2 + model.vocab) * model.value_bytes
    return [model.layers // p * min(p - s, m) * layer + (head if s == p - 1 else 0)
            for s in range(p)]


DRAWN = {"micro_batches": 4, "context": 48}


def test_stages_are_checked_against_a_run_and_mistakes_explained():
    assert "correct: both stages within" in ex.check_stages(stages, DRAWN)
    assert stages(ex.run_model(DRAWN), P.Plan(dp=1, tp=1, pp=2, micro_batches=4)) == \
        pytest.approx(ex.stage_activation_bytes(ex.run_model(DRAWN),
                                                P.Plan(dp=1, tp=1, pp=2, micro_batches=4)))

    def all_in_flight(model, plan):  # GPipe's count: every micro-batch on every stage
        return [v * plan.micro_batches / min(plan.pp - s, plan.micro_batches)
                for s, v in enumerate(stages(model, plan))]

    with pytest.raises(common.ExerciseFailed, match="stage 1's prediction is \\+300% off"):
        ex.check_stages(all_in_flight, DRAWN)
    with pytest.raises(common.ExerciseFailed, match="2 numbers of bytes"):
        ex.check_stages(lambda model, plan: 1.0, DRAWN)


def test_stages_want_the_drawn_run_and_hidden_cases_in_a_graded_run(monkeypatch, tmp_path):
    monkeypatch.setenv(common.GRADING_SEED, "8")  # the drawn run
    monkeypatch.setenv(common.HIDDEN_SEED, "8")  # the hidden cases
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    drawn = common.drawn("lesson12.pipeline", ex.draw_pipeline)
    assert "correct" in ex.check_stages(stages, drawn)
    other = dict(drawn, context=80)
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        ex.check_stages(stages, other)

    def pp2_only(model, plan):  # right for two stages, wrong for four
        return stages(model, plan) if plan.pp == 2 else [0.0] * plan.pp

    assert "recorded" in ex.check_stages(pp2_only, drawn)
    last = sorted(tmp_path.iterdir())[-1]
    data = common.from_plain(json.loads(last.read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson12.stages"](data)


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
