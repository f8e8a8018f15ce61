"""Lesson 12's checks: each accepts a right answer, explains a wrong one, judges hidden cases
only in a graded run, and leaves the verdict to the grader where the student edition lacks the
reference (course_lib.exercises.lesson12)."""

import json

import pytest

from course_lib import planner as P
from course_lib.exercises import common
from course_lib.exercises import lesson12 as ex


def sequence_parallel(model, plan):
    s, h, a, t = model.seq, model.hidden, model.heads, plan.tp
    b = model.global_batch / (plan.dp * plan.micro_batches)
    if plan.recompute:
        return model.value_bytes * s * b * h / t
    return s * b * h * (34 / t + 5 * a * s / (h * t))


def test_the_reference_is_korthikantis_count_and_divides_it_by_t():
    model = P.Transformer(layers=2, hidden=8, heads=2, seq=4, vocab=10, global_batch=4)
    plan = P.Plan(dp=1, tp=2, pp=1, micro_batches=2)
    # s b h (34/t + 5 a s/(h t)) with s 4, b 2, h 8, a 2, t 2
    assert ex.sequence_parallel_bytes_per_layer(model, plan) == pytest.approx(
        4 * 2 * 8 * (17 + 5 * 2 * 4 / 16))
    one = P.Plan(dp=1, tp=1, pp=1, micro_batches=2)  # t = 1: the same as without
    assert ex.sequence_parallel_bytes_per_layer(model, one) == pytest.approx(
        P.activation_bytes_per_layer(model, one))


def test_sequence_parallel_accepts_the_count_and_explains_mistakes():
    assert "correct" in ex.check_sequence_parallel(sequence_parallel)
    with pytest.raises(common.ExerciseFailed, match="without sequence parallelism"):
        ex.check_sequence_parallel(P.activation_bytes_per_layer)
    with pytest.raises(common.ExerciseFailed, match="return a number of bytes"):
        ex.check_sequence_parallel(lambda model, plan: None)

    def no_recompute_split(model, plan):
        value = sequence_parallel(model, plan)
        return value * plan.tp if plan.recompute else value

    with pytest.raises(common.ExerciseFailed, match="input, kept for recomputation, is split"):
        ex.check_sequence_parallel(no_recompute_split)


def test_sequence_parallel_hidden_case_only_in_a_graded_run(monkeypatch, tmp_path):
    def visible_only(model, plan):  # wrong for the hidden case's vocabulary of 32,000
        return sequence_parallel(model, plan) * (1.5 if model.vocab == 32_000 else 1)

    assert "correct" in ex.check_sequence_parallel(visible_only)
    monkeypatch.setenv(common.GRADING_SEED, "5")
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_sequence_parallel(visible_only)
    data = common.from_plain(json.loads(next(tmp_path.iterdir()).read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson12.sequence_parallel"](data)


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
    monkeypatch.setenv(common.GRADING_SEED, "8")
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


def test_without_the_reference_the_grader_judges(monkeypatch):
    def stripped(model, plan):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "sequence_parallel_bytes_per_layer", stripped)
    assert "recorded: the grader judges" in ex.check_sequence_parallel(sequence_parallel)
