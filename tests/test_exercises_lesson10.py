"""Lesson 10's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson10)."""

import json

import pytest
import torch.distributed as dist

from course_lib.exercises import common
from course_lib.exercises import lesson10 as ex
from course_lib.runtime.timing import Span


def overlapped(model, micro_batches):
    params = list(model.parameters())
    seen = {id(p): 0 for p in params}
    pending = []

    def ready(p):
        seen[id(p)] += 1
        if seen[id(p)] == micro_batches:
            p.grad /= dist.get_world_size()
            pending.append(dist.all_reduce(p.grad, async_op=True))

    for p in params:
        p.register_post_accumulate_grad_hook(ready)

    def wait():
        for work in pending:
            work.wait()
        pending.clear()
        for p in params:
            seen[id(p)] = 0

    return wait


def every_backward(model, micro_batches):  # the library's (b): an all-reduce per backward
    pending = []

    def ready(p):
        pending.append((p, dist.all_reduce(p.grad, async_op=True)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(ready)

    def wait():
        for _, work in pending:
            work.wait()
        pending.clear()

    return wait


def after_backward(model, micro_batches):  # right numbers, no overlap
    def wait():
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()

    return wait


def not_divided(model, micro_batches):
    wait = overlapped(model, micro_batches)

    def doubled():
        wait()
        for p in model.parameters():
            p.grad *= dist.get_world_size()

    return doubled


def right_when_three(model, micro_batches):  # the visible case has 3 micro-batches
    return overlapped(model, 3) if micro_batches == 3 else after_backward(model, micro_batches)


def test_overlapped_accepts_hooks_on_the_last_micro_batch_and_explains_mistakes():
    assert "correct" in ex.check_overlapped(overlapped)
    with pytest.raises(common.ExerciseFailed, match="18 all-reduces for 6 parameters"):
        ex.check_overlapped(every_backward)
    with pytest.raises(common.ExerciseFailed, match="6 were started after it"):
        ex.check_overlapped(after_backward)
    with pytest.raises(common.ExerciseFailed, match="differ from one process"):
        ex.check_overlapped(not_divided)


def test_overlapped_hidden_case_is_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    assert "correct" in ex.check_overlapped(right_when_three)
    for seed in range(1, 50):
        monkeypatch.setenv(common.HIDDEN_SEED, str(seed))
        if ex.cases_for(seed)[-1]["micro"] != 3:
            break
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_overlapped(right_when_three)
    data = common.from_plain(json.loads(next(tmp_path.iterdir()).read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson10.overlapped"](data)


BARS = {"DDP 1 MB": [Span(0, 0.0, 1.0, "forward"), Span(0, 1.0, 2.0, "backward"),
                     Span(1, 2.0, 1.5, "all-reduce"), Span(1, 2.5, 1.5, "all-reduce"),
                     Span(2, 0.0, 4.0, "backward"), Span(3, 3.0, 2.0, "all-reduce")]}


@pytest.mark.parametrize(("rank", "right"), [(0, 1.0), (1, 1.0)])
def test_exposed_counts_overlapping_bars_once_and_subtracts_backward(rank, right):
    target = {"sync": "DDP 1 MB", "rank": rank}
    assert abs(ex.exposed_seconds(BARS["DDP 1 MB"], rank) - right) < 1e-12
    assert "correct" in ex.check_exposed(right, BARS, target)
    with pytest.raises(common.ExerciseFailed, match="milliseconds"):
        ex.check_exposed(right * 1e3, BARS, target)
    with pytest.raises(common.ExerciseFailed, match="all of the rank's communication"):
        ex.check_exposed(2.0, BARS, target)
    with pytest.raises(common.ExerciseFailed, match="not what"):
        ex.check_exposed(right + 0.1, BARS, target)


def test_exposed_refuses_what_is_not_an_answer_or_not_the_run():
    target = {"sync": "DDP 1 MB", "rank": 0}
    for answer in (None, True, float("nan"), "1.0"):
        with pytest.raises(common.ExerciseFailed, match="number of seconds"):
            ex.check_exposed(answer, BARS, target)
    with pytest.raises(common.ExerciseFailed, match="profiled"):
        ex.check_exposed(1.0, {"other": []}, target)


def test_exposed_wants_the_drawn_target_in_a_graded_run(monkeypatch):
    monkeypatch.setenv(common.GRADING_SEED, "7")
    drawn = common.drawn("lesson10.target", ex.draw_target)
    bars = {name: BARS["DDP 1 MB"] for name in ex.TARGETS}
    assert "correct" in ex.check_exposed(1.0, bars, drawn)
    other = dict(drawn, rank=1 - drawn["rank"])
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        ex.check_exposed(1.0, bars, other)


def test_a_judge_without_its_reference_leaves_the_verdict_to_the_grader(monkeypatch):
    def stripped(spans, rank):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "exposed_seconds", stripped)
    verdict = ex.check_exposed(1.0, BARS, {"sync": "DDP 1 MB", "rank": 0})
    assert "grader judges this exercise" in verdict
