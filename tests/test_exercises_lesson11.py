"""Lesson 11's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson11)."""

import json

import pytest
import torch
import torch.distributed as dist

from course_lib.exercises import common
from course_lib.exercises import lesson11 as ex


def zero1(params, lr, momentum):
    world, rank = dist.get_world_size(), dist.get_rank()
    numel = sum(p.numel() for p in params)
    size = -(-numel // world)
    buf = torch.zeros(size, dtype=params[0].dtype)
    state = {"first": True}

    def step():
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        flat = torch.nn.functional.pad(flat, (0, size * world - numel))
        dist.all_reduce(flat)
        g = flat[rank * size:(rank + 1) * size] / world
        if state["first"]:
            buf.copy_(g)
            state["first"] = False
        else:
            buf.mul_(momentum).add_(g)
        mine = torch.nn.functional.pad(torch.cat([p.detach().reshape(-1) for p in params]),
                                       (0, size * world - numel))[rank * size:(rank + 1) * size]
        mine = mine - lr * buf
        full = torch.empty(size * world, dtype=mine.dtype)
        dist.all_gather_single(full, mine)
        offset = 0
        with torch.no_grad():
            for p in params:
                p.copy_(full[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    return step, [buf]


def unsharded(params, lr, momentum):  # right steps, but every rank keeps all the momentum
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum)

    def step():
        for p in params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()

    return step, [torch.zeros(sum(p.numel() for p in params))]


def reports_nothing(params, lr, momentum):  # all the momentum kept, an empty state reported
    buffers = {}

    def step():
        for p in params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
            b = buffers.get(p)
            buffers[p] = p.grad.clone() if b is None else b.mul_(momentum).add_(p.grad)
            with torch.no_grad():
                p -= lr * buffers[p]

    return step, []


def no_momentum(params, lr, momentum):
    step, state = zero1(params, lr, 0.0)
    return step, state


def right_when_visible(params, lr, momentum):  # the hidden case has another momentum
    return zero1(params, lr, 0.9) if momentum == 0.9 else no_momentum(params, lr, momentum)


def test_zero1_accepts_a_sharded_momentum_and_explains_mistakes():
    assert "correct" in ex.check_zero1(zero1)
    with pytest.raises(common.ExerciseFailed, match="keeps 132 numbers .*at most 33"):
        ex.check_zero1(unsharded)  # SGD's momentum and the zeros it returns: both measured
    with pytest.raises(common.ExerciseFailed, match="keeps 66 numbers .*at most 33"):
        ex.check_zero1(reports_nothing)
    with pytest.raises(common.ExerciseFailed, match="differ from SGD with momentum 0.9"):
        ex.check_zero1(no_momentum)


def test_zero1_hidden_case_is_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    assert "correct" in ex.check_zero1(right_when_visible)
    monkeypatch.setenv(common.HIDDEN_SEED, "11")
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_zero1(right_when_visible)
    data = common.from_plain(json.loads(next(tmp_path.iterdir()).read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson11.zero1"](data)


PADDING = {"forward": 0.02, "backward": 0.04}
WALLS = {2: 5 * 0.062, 4: 9 * 0.063, 8: 17 * 0.0635}  # c = m v + p - 1 = 5, 9, 17


def test_overhead_is_the_least_squares_fit_and_explains_mistakes():
    right = ex.overhead_fit(WALLS, 2, 2, 0.02, 0.04)
    c = [5, 9, 17]
    w = [WALLS[2], WALLS[4], WALLS[8]]
    expected = sum(ci * (wi - ci * 0.06) for ci, wi in zip(c, w, strict=True)) / (
        2 * sum(ci * ci for ci in c))
    assert right == pytest.approx(expected, rel=1e-12)
    assert "correct" in ex.check_overhead(right, WALLS, PADDING)
    with pytest.raises(common.ExerciseFailed, match="milliseconds"):
        ex.check_overhead(right * 1e3, WALLS, PADDING)
    with pytest.raises(common.ExerciseFailed, match="factor of 2"):
        ex.check_overhead(2 * right, WALLS, PADDING)
    with pytest.raises(common.ExerciseFailed, match="least-squares"):
        ex.check_overhead(right + 1e-3, WALLS, PADDING)
    for answer in (None, True, float("inf")):
        with pytest.raises(common.ExerciseFailed, match="number of seconds"):
            ex.check_overhead(answer, WALLS, PADDING)
    with pytest.raises(common.ExerciseFailed, match="walls"):
        ex.check_overhead(right, {2: 0.3}, PADDING)


def test_overhead_wants_the_drawn_padding_in_a_graded_run(monkeypatch):
    monkeypatch.setenv(common.GRADING_SEED, "3")
    padding = common.drawn("lesson11.padding", ex.draw_padding)
    right = ex.overhead_fit(WALLS, 2, 2, padding["forward"], padding["backward"])
    assert "correct" in ex.check_overhead(right, WALLS, padding)
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        ex.check_overhead(right, WALLS, dict(padding, forward=padding["forward"] + 0.001))


def test_the_student_edition_says_whether_the_fit_is_least_squares(monkeypatch):
    right = ex.overhead_fit(WALLS, 2, 2, 0.02, 0.04)

    def stripped(*args):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "overhead_fit", stripped)
    assert ex.check_overhead(right, WALLS, PADDING).startswith("recorded: right for this run")
    for wrong in (right * 1.01, 2 * right, right * 1e3, right - 1e-5):
        with pytest.raises(common.ExerciseFailed, match="not the least-squares o"):
            ex.check_overhead(wrong, WALLS, PADDING)
