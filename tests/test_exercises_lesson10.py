"""Lesson 10's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson10)."""

import json

import pytest
import torch.distributed as dist

from course_lib.exercises import cases, common
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


STEP = [Span(0, 0.0, 1.0, "forward"), Span(0, 1.0, 2.0, "backward"),
        Span(1, 2.0, 1.5, "all-reduce"), Span(1, 2.5, 1.5, "all-reduce"),
        Span(2, 0.0, 4.0, "backward"), Span(3, 3.0, 2.0, "all-reduce")]
PROFILED = {name: STEP for name in ex.TARGETS}  # what section 2's `profiled` holds


def exposed(spans, rank):  # cut time at every edge; count slices in a message, not in backward
    comm = [(s.start, s.start + s.duration) for s in sorted(spans, key=lambda s: s.start)
            if s.lane == 2 * rank + 1 and s.kind == "all-reduce"]
    back = [(s.start, s.start + s.duration) for s in spans
            if s.lane == 2 * rank and s.kind == "backward"]
    out = []
    for a, b in comm:
        cuts = sorted({a, b, *(t for c, d in back for t in (c, d) if a < t < b)})
        out.append(sum(r - q for q, r in zip(cuts, cuts[1:], strict=False)
                       if not any(c <= (q + r) / 2 < d for c, d in back)))
    return out


def whole_bars(spans, rank):
    return [s.duration for s in sorted(spans, key=lambda s: s.start)
            if s.lane == 2 * rank + 1 and s.kind == "all-reduce"]


def after_backward_ends(spans, rank):  # right while backward is one bar
    end = max((s.start + s.duration for s in spans if s.lane == 2 * rank
               and s.kind == "backward"), default=0.0)
    return [max(0.0, s.start + s.duration - max(s.start, end))
            for s in sorted(spans, key=lambda s: s.start)
            if s.lane == 2 * rank + 1 and s.kind == "all-reduce"]


def right_on_visible(spans, rank):  # the visible answers by heart, anything elsewhere
    for step in ex.VISIBLE:
        if [tuple(s) for s in spans] == [tuple(s) for s in step]:
            return exposed(spans, rank)
    return [0.0] * len(whole_bars(spans, rank))


def test_the_reference_gives_the_visible_answers_and_their_digest():
    answers = [[ex.exposed_per_message(step, r) for r in (0, 1)] for step in ex.VISIBLE]
    assert answers == [[[0.0, 1.0], [1.0]], [[0.0, 0.25, 0.625], []]]
    assert cases.digest(answers) == ex.VISIBLE_DIGEST
    assert ex.exposed_per_message(STEP, 0) == [0.5, 1.0]
    assert ex.exposed_per_message(STEP, 1) == [1.0]


def test_exposed_accepts_a_right_function_and_explains_wrong_ones():
    assert "correct" in ex.check_exposed(exposed, PROFILED)
    assert "correct" in ex.check_exposed(ex.exposed_per_message, PROFILED)
    for wrong in (whole_bars, after_backward_ends):
        with pytest.raises(common.ExerciseFailed, match="not right on the visible steps"):
            ex.check_exposed(wrong, PROFILED)
    with pytest.raises(common.ExerciseFailed, match="your run's step with 'per parameter': "
                       "rank 0's all-reduce 0"):
        ex.check_exposed(right_on_visible, PROFILED)
    with pytest.raises(common.ExerciseFailed, match="profiled"):
        ex.check_exposed(exposed, {"other": []})


def test_exposed_judges_hidden_steps_only_in_a_graded_run(monkeypatch, tmp_path):
    run = {name: [s for s in ex.VISIBLE[1]] for name in ex.TARGETS}
    assert "correct" in ex.check_exposed(right_on_visible, run)
    monkeypatch.setenv(common.HIDDEN_SEED, "5")
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_exposed(right_on_visible, run)
    data = common.from_plain(json.loads(next(tmp_path.iterdir()).read_text()))
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson10.exposed"](data)


def test_the_student_edition_judges_the_visible_steps_and_leaves_the_rest_to_the_grader(
        monkeypatch):
    def stripped(spans, rank):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "exposed_per_message", stripped)
    assert ex.check_exposed(exposed, PROFILED).startswith("recorded: right on the visible steps")
    with pytest.raises(common.ExerciseFailed, match="not right on the visible steps"):
        ex.check_exposed(whole_bars, PROFILED)
