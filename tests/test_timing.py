"""Timing (course_lib.runtime.timing): warm-up, repeats, median and spread; timelines."""

import pytest
import torch

from course_lib.runtime.timing import (
    Timeline,
    Timing,
    measure,
    measure_interleaved,
    median_of_slowest,
    synchronize,
    to_spans,
)


def test_measure_warms_up_then_times_each_repeat():
    calls = []
    timing = measure(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and len(timing.times) == 4
    assert all(t >= 0 for t in timing.times)


def test_median_quartiles_and_spread():
    t = Timing([5.0, 1.0, 3.0, 2.0, 4.0])
    assert t.median == pytest.approx(3.0)
    assert t.quartiles == pytest.approx((2.0, 4.0))
    assert t.spread == pytest.approx(2.0)
    assert Timing([0.5]).spread == pytest.approx(0.0)


def test_str_reports_median_spread_and_runs():
    text = str(Timing([0.010, 0.012, 0.011]))
    assert "11 ms median" in text and "3 runs" in text


@pytest.mark.parametrize("counts, match", [
    (dict(repeats=0), "repeats must be a whole number of at least 1"),
    (dict(repeats=True), "repeats must be"), (dict(repeats=2.5), "repeats must be"),
    (dict(warmup=-1), "warmup must be a whole number of at least 0")])
def test_measure_rejects_nonsense(counts, match):
    with pytest.raises(ValueError, match=match):
        measure(lambda: None, **counts)
    with pytest.raises(ValueError, match=match):
        measure_interleaved({"a": lambda: None}, **counts)


@pytest.mark.parametrize("times", [[], [1.0, float("nan"), 2.0], [float("inf")], [-1.0]])
def test_a_timing_refuses_no_times_and_times_that_are_not_finite_or_negative(times):
    with pytest.raises(ValueError, match="one or more times, each finite and zero or more"):
        Timing(times)


def test_synchronize_on_cpu_is_a_no_op():
    synchronize("cpu")
    synchronize(None)
    synchronize(torch.device("cpu"))


def test_median_of_slowest_takes_the_last_rank_of_each_repeat():
    assert median_of_slowest([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == pytest.approx(3.0)


def test_timeline_records_spans_and_busy_time():
    t = Timeline(lane=2)
    t.add("idle", 10.0, 10.5)
    with t.span("compute"):
        pass
    t.add("forward", 11.0, 11.25)
    kinds = [kind for kind, _, _ in t.records]
    assert kinds == ["idle", "compute", "forward"]
    _, start, end = t.records[1]
    assert 0 <= end - start < 1.0
    assert t.busy() == pytest.approx(0.25 + (end - start))


def test_to_spans_puts_lanes_on_one_clock_and_cuts_before_the_origin():
    a, b = Timeline(0, [("idle", 9.0, 10.5), ("forward", 10.5, 11.0)]), Timeline(1)
    b.add("backward", 11.0, 12.0)
    spans = to_spans([a, b], origin=10.0)
    assert [(s.lane, s.kind) for s in spans] == [(0, "idle"), (0, "forward"), (1, "backward")]
    assert [x for s in spans for x in (s.start, s.duration)] == pytest.approx([0, 0.5, 0.5, 0.5,
                                                                                1, 1])
    first = to_spans([a, b])[0]  # default origin: the earliest record
    assert (first.lane, first.kind) == (0, "idle")
    assert (first.start, first.duration) == pytest.approx((0.0, 1.5))
    assert to_spans([Timeline(0, [("idle", 1.0, 2.0)])], origin=3.0) == []  # ended before
    for empty in ([], [Timeline(0)]):
        with pytest.raises(ValueError, match="no timeline holds a record"):
            to_spans(empty)


def test_measure_interleaved_takes_turns():
    order = []
    timings = measure_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                                  repeats=3, warmup=1)
    assert order == ["a", "b"] + ["a", "b"] * 3  # warm-ups, then one of each per round
    assert {name: len(t.times) for name, t in timings.items()} == {"a": 3, "b": 3}
    with pytest.raises(ValueError):
        measure_interleaved({"a": lambda: None}, repeats=0)
