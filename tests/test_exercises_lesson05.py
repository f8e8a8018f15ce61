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


def test_slow_stage_bubble_accepts_the_prediction_and_explains_mistakes():
    right = 1 - 8 * 15 / (4 * (3 + 8 * 6 + 6))  # fill, the slow stage's work, drain
    assert "correct" in ex.check_slow_stage_bubble(right)
    assert "correct" in ex.check_slow_stage_bubble(round(right, 2))  # within the tolerance
    with pytest.raises(common.ExerciseFailed, match="equal stages"):
        ex.check_slow_stage_bubble(bubble_fraction(4, 8))
    with pytest.raises(common.ExerciseFailed, match="too low"):
        ex.check_slow_stage_bubble(1 - 8 * 15 / (4 * (3 + 8 * 6)))  # forgot the drain
    with pytest.raises(common.ExerciseFailed, match="percentage"):
        ex.check_slow_stage_bubble(100 * right)
    with pytest.raises(common.ExerciseFailed, match="as a number"):
        ex.check_slow_stage_bubble("0.47")


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
    data = common.to_plain(ex._probe_gather(Gather))
    judged = common.from_plain(data)
    rank0 = judged["visible"]["ranks"][0]
    rank0["out"] = rank0["out"][:, :4]  # what an all-reduce (Megatron's g) would return
    with pytest.raises(common.ExerciseFailed, match="shape \\(6, 4\\)"):
        ex._judge_gather(judged)
    judged = common.from_plain(data)  # a fresh copy of the same run
    judged["visible"]["ranks"][1]["w_grad"] = None
    with pytest.raises(common.ExerciseFailed, match="no gradient"):
        ex._judge_gather(judged)


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    assert "correct" in ex.check_gather(RightOnVisibleOnly)
    monkeypatch.setenv(common.GRADING_SEED, "12345")  # its hidden layer has 2 x 3 outputs
    # in the grader's kernel the data goes to a file and the verdict is the grader's
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_gather(RightOnVisibleOnly)
    written = list(tmp_path.iterdir())
    assert [p.name for p in written] == ["000-lesson05.gather.json"]
    data = common.from_plain(json.loads(written[0].read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson05.gather"](data)
