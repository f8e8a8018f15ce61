"""Timing (course_lib.timing): warm-up, repeats, median and spread."""

import pytest
import torch

from course_lib.timing import Timing, measure, synchronize


def test_measure_warms_up_then_times_each_repeat():
    calls = []
    timing = measure(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and len(timing.times) == 4
    assert all(t >= 0 for t in timing.times)


def test_median_quartiles_and_spread():
    t = Timing([5.0, 1.0, 3.0, 2.0, 4.0])
    assert t.median == 3.0
    assert t.quartiles == (2.0, 4.0)
    assert t.spread == 2.0
    assert Timing([0.5]).spread == 0.0


def test_str_reports_median_spread_and_runs():
    text = str(Timing([0.010, 0.012, 0.011]))
    assert "11 ms median" in text and "3 runs" in text


def test_measure_rejects_nonsense():
    with pytest.raises(ValueError):
        measure(lambda: None, repeats=0)


def test_synchronize_on_cpu_is_a_no_op():
    synchronize("cpu")
    synchronize(None)
    synchronize(torch.device("cpu"))
