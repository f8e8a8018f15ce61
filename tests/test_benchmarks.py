"""The launcher benchmark runs and reports ratios (it asserts nothing about time)."""

import pytest

from course_lib.benchmarks import data_parallel as dp_benchmark
from course_lib.benchmarks import launch as bench
from course_lib.runtime.timing import Timing


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


def test_data_parallel_benchmark_prints_the_ring_ratio_and_the_ddp_speedup(capsys):
    bw, times = dp_benchmark.main(["--repeats", "1", "--steps", "2"])
    out = capsys.readouterr().out
    assert "ratio ring / torch" in out and "speedup" in out
    assert set(bw) == {"torch", "efficient ring"} and all(v > 0 for v in bw.values())
    assert set(times) == {1, 2} and all(len(t) == 2 for t in times.values())
