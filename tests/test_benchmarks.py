"""The launcher benchmark runs and reports ratios (it asserts nothing about time)."""

import os

import pytest

from course_lib.benchmarks import data_parallel as dp_benchmark
from course_lib.benchmarks import launch as bench
from course_lib.runtime.timing import Timing


def test_every_launcher_runs_the_job_and_ratios_are_reported():
    timings = bench.compare_launchers(repeats=1, warmup=0)
    assert set(timings) == {"launch, warm", "launch, cold", "torchrun", "mp.spawn"}
    table = bench.format_comparison(timings)
    assert "ratio to torchrun" in table
    assert table.splitlines()[3].rstrip().endswith("1.00")  # torchrun against itself


def test_format_comparison_ratios():
    table = bench.format_comparison({"launch, warm": Timing([1.0]), "torchrun": Timing([4.0])})
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


def test_thread_benchmark_times_each_setting_idle_and_busy_and_restores_threads():
    import torch

    from course_lib.benchmarks import threads as bench_threads

    before = torch.get_num_threads()
    timings = bench_threads.compare_threads(threads=(1, 2), repeats=1, steps=1)
    assert set(timings) == {(1, "idle"), (2, "idle"), (1, "busy"), (2, "busy")}
    assert torch.get_num_threads() == before
    table = bench_threads.format_threads(timings)
    assert len(table.splitlines()) == 3 and "busy / idle" in table


def test_busy_process_is_gone_after_the_block():
    import psutil

    from course_lib.benchmarks.threads import busy_process

    with busy_process() as proc:
        lowest = 19 if os.name == "posix" else psutil.IDLE_PRIORITY_CLASS
        assert psutil.Process(proc.pid).nice() == lowest
        if os.name == "posix":  # its own session, as a program beside the kernel would be
            assert os.getsid(proc.pid) != os.getsid(0)
    assert proc.poll() is not None


def test_speed_benchmark_times_both_federated_engines():
    from course_lib.benchmarks import speed

    rounds = speed.federated_rounds(repeats=1, rounds=1)
    assert set(rounds) == {"batched", "loop"} and all(t.median > 0 for t in rounds.values())
    assert "batched / loop" in speed.format_rounds(rounds)
