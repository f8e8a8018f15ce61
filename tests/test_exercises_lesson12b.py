"""Lesson 12b's checks: each accepts a right answer, explains a wrong one, judges hidden cases
only in a graded run, and leaves the verdict to the grader where the student edition lacks the
reference (course_lib.exercises.lesson12b)."""

import json

import pytest

from course_lib import planner as P
from course_lib.exercises import common
from course_lib.exercises import lesson12b as ex


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
    drawn = common.drawn("lesson12b.pipeline", ex.draw_pipeline)
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
        common.JUDGES["lesson12b.stages"](data)


def pairs_in_order(predicted, measured):
    right, pairs = 0.0, 0
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            if measured[i] != measured[j]:
                pairs += 1
                same = (predicted[i] - predicted[j]) * (measured[i] - measured[j])
                right += 1.0 if same > 0 else 0.5 if same == 0 else 0.0
    return right / pairs if pairs else None


def ties_as_wrong(predicted, measured):  # a predicted tie counted as a miss
    share = pairs_in_order(predicted, measured)
    if share is None:
        return None
    ties = sum(predicted[i] == predicted[j] and measured[i] != measured[j]
               for i in range(len(measured)) for j in range(i + 1, len(measured)))
    pairs = sum(measured[i] != measured[j]
                for i in range(len(measured)) for j in range(i + 1, len(measured)))
    return share - 0.5 * ties / pairs


def test_pairs_in_order_accepts_kendalls_count_and_explains_ties_and_none():
    assert "the planner put 93% of the pairs" in \
        ex.check_pairs_in_order(pairs_in_order)
    with pytest.raises(common.ExerciseFailed, match="7 plans: 0.904.* is not the share"):
        ex.check_pairs_in_order(ties_as_wrong)
    with pytest.raises(common.ExerciseFailed, match="all equal: return None"):
        ex.check_pairs_in_order(lambda p, m: pairs_in_order(p, m) or 0.0)
    assert ex.share_in_order([1, 2, 3], [3, 2, 1]) == 0.0
    assert ex.share_in_order([1, 1], [1, 2]) == 0.5


def test_pairs_in_order_judges_hidden_rankings_in_a_graded_run_and_digests_without_the_reference(
        monkeypatch):
    visible = [m for _, m in ex.VISIBLE_RANKINGS]

    def right_on_visible_only(predicted, measured):
        return pairs_in_order(predicted, measured) if measured in visible else 1.0

    assert "correct" in ex.check_pairs_in_order(right_on_visible_only)
    with monkeypatch.context() as m:
        m.setenv(common.HIDDEN_SEED, "12345")
        with pytest.raises(common.HiddenTestFailed):
            ex.check_pairs_in_order(right_on_visible_only)

    def stripped(predicted, measured):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "share_in_order", stripped)  # as the student edition has it
    assert ex.check_pairs_in_order(pairs_in_order).startswith("correct for the visible rankings")
    with pytest.raises(common.ExerciseFailed, match="share: 0.904.* is not right"):
        ex.check_pairs_in_order(ties_as_wrong)


def test_stages_refuse_measured_bytes_that_are_not_positive_numbers(monkeypatch, tmp_path):
    # NaN made "off by more than 2%" false: any prediction passed the run's comparison
    for name, value in ((common.GRADING_SEED, "8"), (common.HIDDEN_SEED, "8"),
                        (common.GRADING_OUT, str(tmp_path))):
        monkeypatch.setenv(name, value)
    ex.check_stages(stages, common.drawn("lesson12b.pipeline", ex.draw_pipeline))  # recorded
    data = common.from_plain(json.loads(sorted(tmp_path.iterdir())[-1].read_text()))
    judge = common.JUDGES["lesson12b.stages"]
    for measured in ([float("nan")] * 2, [0.0, 1.0], [-5.0, 1.0], "many"):
        with pytest.raises(common.ExerciseFailed, match="the bytes the run measured"):
            judge(dict(data, measured=measured, predicted=[1.0, 2.0]))
    assert judge(data).startswith("correct")
