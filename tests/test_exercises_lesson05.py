"""Lesson 5's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson05)."""

import json

import pytest
import torch
import torch.distributed as dist

from course_lib.cost_models import bubble_fraction, idle_fraction, pipeline_timeline
from course_lib.exercises import common
from course_lib.exercises import lesson05 as ex


def test_the_timeline_model_takes_one_time_per_stage():
    spans = pipeline_timeline(4, 8, "GPipe", forward=[1, 1, 1, 2], backward=[2, 2, 2, 4])
    # a flow shop of identical jobs: all steps of one micro-batch, then m - 1 of the slowest
    assert max(start + duration for _, start, duration, _ in spans) == 15 + 7 * 6
    assert idle_fraction(pipeline_timeline(4, 8, forward=[1] * 4, backward=[2] * 4), 4) == \
        pytest.approx(bubble_fraction(4, 8))
    with pytest.raises(ValueError, match="one time per stage"):
        pipeline_timeline(4, 8, forward=[1, 2])


def predicted(p, m, k):  # the notebook's solution: fill, the slow stage's m steps, drain
    length = (p - 1) * 1 + m * 3 * k + (p - 1) * 2
    return 1 - m * ((p - 1) * 3 + 3 * k) / (p * length)


@pytest.mark.parametrize(("p", "m", "k"), [(4, 8, 2.0), (3, 13, 1.5), (6, 4, 3.0), (5, 16, 2.5)])
def test_slow_stage_bubble_accepts_the_prediction_for_each_drawn_pipeline(p, m, k):
    times = ex.slow_last_stage(p, k)
    assert idle_fraction(pipeline_timeline(p, m, **times), p) == pytest.approx(predicted(p, m, k))
    assert "correct" in ex.check_slow_stage_bubble(predicted(p, m, k), p, m, k)
    assert "correct" in ex.check_slow_stage_bubble(predicted(p, m, k) + 0.004, p, m, k)
    with pytest.raises(common.ExerciseFailed, match="too (low|high)"):  # another draw's answer
        ex.check_slow_stage_bubble(predicted(4, 8, 2.0) if (p, m, k) != (4, 8, 2.0)
                                   else predicted(3, 13, 1.5), p, m, k)


def test_slow_stage_bubble_explains_mistakes():
    right = 1 - 8 * 15 / (4 * (3 + 8 * 6 + 6))  # p = 4, m = 8, k = 2
    assert right == pytest.approx(predicted(4, 8, 2))
    assert "correct" in ex.check_slow_stage_bubble(round(right, 2), 4, 8, 2.0)  # within 0.005
    with pytest.raises(common.ExerciseFailed, match="4 equal stages"):
        ex.check_slow_stage_bubble(bubble_fraction(4, 8), 4, 8, 2.0)
    with pytest.raises(common.ExerciseFailed, match="too low for p = 4, m = 8, slowdown 2"):
        ex.check_slow_stage_bubble(1 - 8 * 15 / (4 * (3 + 8 * 6)), 4, 8, 2.0)  # forgot the drain
    with pytest.raises(common.ExerciseFailed, match="percentage"):
        ex.check_slow_stage_bubble(100 * right, 4, 8, 2.0)
    with pytest.raises(common.ExerciseFailed, match="as a number"):
        ex.check_slow_stage_bubble("0.47", 4, 8, 2.0)
    for bad in ((4.0, 8, 2.0), (4, 0, 2.0), (40, 8, 2.0), (4, 8, "2"), (4, 8, 0.5)):
        with pytest.raises(common.ExerciseFailed, match="pipeline drawn above"):
            ex.check_slow_stage_bubble(right, *bad)



def test_in_a_graded_run_the_pipeline_must_be_the_one_drawn_for_it(monkeypatch):
    monkeypatch.setenv(common.GRADING_SEED, "7")
    p, m, k = common.drawn("lesson05.slow_pipeline", ex.draw_slow_pipeline)
    assert 3 <= p <= 6 and 4 <= m <= 16 and k in (1.5, 2.0, 2.5, 3.0)
    assert [p, m, k] == common.drawn("lesson05.slow_pipeline", ex.draw_slow_pipeline)
    assert "correct" in ex.check_slow_stage_bubble(predicted(p, m, k), p, m, k)
    other = (p, m + 1 if m < 16 else m - 1, k)  # a classmate's pipeline, and the answer for it
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        ex.check_slow_stage_bubble(predicted(*other), *other)
    monkeypatch.delenv(common.GRADING_SEED)  # outside a graded run any pipeline is checked as is
    assert "correct" in ex.check_slow_stage_bubble(predicted(*other), *other)

class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y):
        pieces = [torch.empty_like(y) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, y.contiguous())
        ctx.rank, ctx.width = dist.get_rank(), y.shape[-1]
        return torch.cat(pieces, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width]


class SummedBackward(Gather):  # torch.distributed.nn's all_gather: a reduce-scatter backward
    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width]


class ReversedOrder(Gather):
    @staticmethod
    def forward(ctx, y):
        pieces = [torch.empty_like(y) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, y.contiguous())
        ctx.rank, ctx.width = dist.get_rank(), y.shape[-1]
        return torch.cat(pieces[::-1], dim=-1)


class RightOnVisibleOnly(Gather):  # the visible layer has 8 outputs, 4 per rank
    @staticmethod
    def backward(ctx, grad):
        part = grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width]
        return part if ctx.width == 4 else 2 * part


def test_gather_accepts_the_gather_and_explains_mistakes():
    assert "correct" in ex.check_gather(Gather)
    with pytest.raises(common.ExerciseFailed, match="2 times too large"):
        ex.check_gather(SummedBackward)
    with pytest.raises(common.ExerciseFailed, match="wrong order"):
        ex.check_gather(ReversedOrder)


def test_gather_explains_a_wrong_shape_and_a_missing_gradient_without_launching_again():
    data = common.to_plain(ex.probe_gather(Gather))
    judged = common.from_plain(data)
    rank0 = judged["visible"]["ranks"][0]
    rank0["out"] = rank0["out"][:, :4]  # what an all-reduce (Megatron's g) would return
    with pytest.raises(common.ExerciseFailed, match="shape \\(6, 4\\)"):
        ex.judge_gather(judged)
    judged = common.from_plain(data)  # a fresh copy of the same run
    judged["visible"]["ranks"][1]["w_grad"] = None
    with pytest.raises(common.ExerciseFailed, match="no gradient"):
        ex.judge_gather(judged)


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    assert "correct" in ex.check_gather(RightOnVisibleOnly)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")  # its hidden layer has 2 x 3 outputs
    # in the grader's kernel the data goes to a file and the verdict is the grader's
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_gather(RightOnVisibleOnly)
    written = list(tmp_path.iterdir())
    assert [p.name for p in written] == ["000-lesson05.gather.json"]
    data = common.from_plain(json.loads(written[0].read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson05.gather"](data)
