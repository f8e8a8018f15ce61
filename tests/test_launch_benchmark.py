"""The launcher benchmark runs and reports ratios (it asserts nothing about time)."""

import pytest

from course_lib import launch_benchmark as bench
from course_lib.timing import Timing


def test_every_launcher_runs_the_job_and_ratios_are_reported():
    timings = bench.compare_launchers(repeats=1, warmup=0)
    assert set(timings) == {"launch", "torchrun", "mp.spawn"}
    table = bench.format_comparison(timings)
    assert "ratio to torchrun" in table
    assert table.splitlines()[2].rstrip().endswith("1.00")  # torchrun against itself


def test_format_comparison_ratios():
    table = bench.format_comparison({"launch": Timing([1.0]), "torchrun": Timing([4.0])})
    assert "0.25" in table.splitlines()[1]


def test_unknown_launcher_is_rejected():
    with pytest.raises(ValueError, match="unknown launchers"):
        bench.compare_launchers(ways=("slurm",))
