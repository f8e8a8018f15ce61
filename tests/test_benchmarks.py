"""The launcher benchmark runs and reports ratios (it asserts nothing about time)."""

import os

import pytest
import torch

from course_lib.benchmarks import data_parallel as dp_benchmark
from course_lib.benchmarks import launch as bench
from course_lib.runtime.timing import Timing


def test_every_launcher_runs_the_job_and_ratios_are_reported():
    timings = bench.compare_launchers(repeats=1, warmup=0)
    assert set(timings) == {"launch, warm", "launch, cold", "torchrun", "mp.spawn"}
    table = bench.format_comparison(timings)
    assert "ratio to torchrun" in table
    assert table.splitlines()[3].rstrip().endswith("1.00")  # torchrun against itself


def test_launchers_are_timed_round_by_round_each_once_a_round():
    timings = bench.compare_launchers(repeats=2, warmup=0, ways=("launch, warm", "launch, cold"))
    assert {name: len(t.times) for name, t in timings.items()} == {"launch, warm": 2,
                                                                   "launch, cold": 2}


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


def test_emulated_strong_scaling_paces_every_world_size_by_one_device():
    import functools

    import torch

    from course_lib.data import load_digits
    from course_lib.models import digits_cnn
    from course_lib.runtime.devices import usable_cores

    digits = load_digits(images=True)
    model_fn = functools.partial(digits_cnn, seed=0, width=2)
    x, y = digits.x_train[:32], digits.y_train[:32]
    out = dp_benchmark.emulated_strong_scaling(model_fn, x, y, workers=(1, 2), ratio=0.001,
                                               steps=1, warmup=1)
    sim = out["similarity"]
    # one worker's whole-batch step takes communication / ratio on the device
    assert sim["flops"] / out["rate"] == pytest.approx(sim["communication"] / 0.001)
    assert out["achieved"] == pytest.approx(0.001) and out["ratio"] == 0.001
    assert set(out["times"]) == {1, 2}
    assert all(len(t) == 1 for m in (1, 2) for t in out["times"][m].values())
    # the link's alpha and beta, fitted to two ranks' all-reduces, and the bytes DDP sends
    assert sim["gradient_bytes"] == 4 * sum(p.numel() for p in model_fn().parameters())
    assert out["alpha"] >= 0 and out["beta"] >= 0 and out["alpha"] + out["beta"] > 0
    assert torch.get_num_threads() == 1
    fast = dp_benchmark.emulated_strong_scaling(model_fn, x, y, workers=(1, 2), ratio=50.0,
                                                steps=1, warmup=1)
    # no faster than 4 x 2 workers / the cores x this CPU (1% inside, as reachable_ratio gives
    # it): the ratio achieved is below the one asked
    least = max(2.0, 4 * 2 / usable_cores())
    assert fast["similarity"]["flops"] / fast["rate"] == pytest.approx(
        least * fast["similarity"]["compute_cpu"] / 0.99)
    assert fast["achieved"] < 50.0
    assert fast["similarity"]["communication"] / fast["achieved"] == pytest.approx(
        fast["similarity"]["flops"] / fast["rate"])
    with pytest.raises(ValueError, match="first step counts FLOPs"):
        dp_benchmark.emulated_strong_scaling(model_fn, x, y, workers=(1,), ratio=1.0, warmup=0)
    with pytest.raises(ValueError, match="ratio must be positive"):
        dp_benchmark.emulated_strong_scaling(model_fn, x, y, ratio=0)
    system = dp_benchmark.lesson_system()
    assert system["ratio"] == pytest.approx(system["communication"] / system["compute"])


def test_the_systems_an_emulated_device_stands_for():
    from course_lib.benchmarks import systems

    node, cluster = systems.gpt3_xl_data_parallel(8, 16), systems.gpt3_xl_data_parallel(32, 8)
    assert node["name"] == "GPT-3 XL (1.3B) on 8 A100s over NVLink"
    assert cluster["name"] == "GPT-3 XL (1.3B) on 32 A100s over InfiniBand"
    assert cluster["ratio"] == pytest.approx(cluster["communication"] / cluster["compute"])
    # twice the sequences per GPU: twice the compute, the same all-reduce
    double = systems.gpt3_xl_data_parallel(32, 16)
    assert double["ratio"] == pytest.approx(cluster["ratio"] / 2)
    assert systems.reference_system() == cluster


def test_the_grading_benchmark_times_sliced_and_whole_runs_and_a_class(tmp_path, capsys):
    from test_grading import _tiny_lesson

    from course_lib.benchmarks import grading as grading_benchmark

    _tiny_lesson(tmp_path / "01_tiny.ipynb")
    out = grading_benchmark.main(["--notebooks", str(tmp_path), "--students", "2",
                                  "--class-lesson", "01"])
    printed = capsys.readouterr().out
    (row,) = out["rows"]
    assert row["lesson"] == "01_tiny" and row["same"] and row["score"] == "2/2"
    assert row["sliced"] > 0 and row["whole"] > 0
    assert set(out["rates"]) == {1, 2} and all(r > 0 for r in out["rates"].values())
    assert "median per lesson" in printed and "submissions per hour" in printed


@pytest.mark.parametrize("module, argv, said", [
    ("launch", ["--repeats", "0"], "argument --repeats: must be above 0, got 0"),
    ("launch", ["--warmup", "-1"], "argument --warmup: must be at least 0, got -1"),
    ("speed", ["--repeats", "0"], "argument --repeats: must be above 0"),
    ("threads", ["--steps", "-2"], "argument --steps: must be above 0"),
    ("emulation", ["--slower", "nan"], "argument --slower: must be above 0"),
    ("overlap", ["--steps", "0"], "argument --steps: must be above 0"),
    ("overlap", ["--emulated", "--backend", "nccl"], "--emulated on CPU ranks (gloo)"),
    ("overlap", ["--world-size", "3"], "the overlap benchmark runs on two ranks"),
    ("grading", ["--lessons", "99"], "no lesson 99 in"),
    ("grading", ["--class-lesson", "x"], "no lesson x in")])
def test_benchmarks_refuse_impossible_counts_and_unknown_lessons_before_any_work(module, argv,
                                                                               said, capsys):
    import importlib
    with pytest.raises(SystemExit) as stopped:
        importlib.import_module(f"course_lib.benchmarks.{module}").main(argv)
    assert stopped.value.code == 2 and said in capsys.readouterr().err


def test_long_sequences_benchmark_times_the_ring_both_ways_and_the_experts_all_to_alls(capsys):
    from course_lib.benchmarks import long_sequences as ls
    from course_lib.experts import capacity

    result = ls.main(["--repeats", "2"])
    ring = result["ring"]
    assert ring["p"] == 2 and "emulated device" in ring["label"]
    assert ring["block"] >= 2 * ring["message"] * (1 - 1e-9)  # at least twice its message
    assert f"a block takes {ring['block'] / ring['message']:.1f} x its message" in ring["label"]
    for mode in ("with overlap", "waiting first"):
        assert len(ring[mode]) == 2 and min(ring[mode]) > 0 and ring["host"][mode] >= 0
    experts = result["experts"]
    assert list(experts["times"]) == [64, 256, 1024, 4096]
    for n, (n_bytes, seconds) in experts["times"].items():  # 4 experts of 64 float32s, top 2
        assert n_bytes == 4 * capacity(n, 4, 2, 1.0) * 64 * 4
        assert len(seconds) == 2 and min(seconds) > 0
    assert experts["alpha"] > 0 and experts["beta"] > 0
    printed = capsys.readouterr().out
    assert "with overlap" in printed and "waiting first" in printed and "4096 tokens" in printed


def test_the_long_sequences_report_puts_each_time_beside_its_model():
    from course_lib.benchmarks import long_sequences as ls

    ring = {"p": 2, "message": 1e-3, "block": 2e-3, "label": "emulated device",
            "with overlap": [5e-3], "waiting first": [6e-3],
            "host": {"with overlap": 0.0, "waiting first": 0.0}}
    experts = {"alpha": 1e-4, "beta": 1e-9, "times": {64: (10**6, [2e-3])}}
    text = ls.report({"ring": ring, "experts": experts})
    assert "model   4.00 ms" in text  # with overlap: a block + max(block, message)
    assert "model   5.00 ms" in text  # waiting first: two blocks + a message
    assert "model   1.20 ms" in text  # 2 (p - 1) (alpha + beta n / p), n = 1 MB
    assert "1/beta 1.00 GB/s" in text
    assert "unbounded" in ls.report({"ring": ring, "experts": experts | {"beta": 0.0}})


def test_long_sequences_benchmark_refuses_what_it_cannot_time():
    from course_lib import launch
    from course_lib.benchmarks import long_sequences as ls
    from course_lib.experts import MixtureOfExperts

    q, gloo = torch.zeros(2, 4, 8), dict(backend="gloo")
    for ratio in (0, -1.0, float("nan"), True):
        with pytest.raises(Exception, match="ratio .* must be positive"):
            launch(ls.time_ring_forward, 2, args=(q, q, q), kwargs=dict(ratio=ratio), **gloo)
    with pytest.raises(Exception, match="ranks of a ring must be a whole number of at least 2"):
        launch(ls.time_ring_forward, 1, args=(q, q, q), **gloo)
    moe = MixtureOfExperts(8, 16, 4)
    with pytest.raises(Exception, match="repeats must be a whole number of at least 1"):
        launch(ls.time_expert_parallel, 2, args=(moe, [8]), kwargs=dict(repeats=0), **gloo)
    with pytest.raises(Exception, match="tokens is empty"):
        launch(ls.time_expert_parallel, 2, args=(moe, []), **gloo)
    with pytest.raises(Exception, match="a count of tokens must be a whole number"):
        launch(ls.time_expert_parallel, 2, args=(moe, [8, 0]), **gloo)
    with pytest.raises(Exception, match="ranks of an all-to-all"):
        launch(ls.alpha_beta_of_all_to_all, 1, **gloo)
    with pytest.raises(SystemExit):  # the parser's usage error: "must be above 0, got 0"
        ls.main(["--repeats", "0"])


def test_the_all_to_all_model_recovers_alpha_and_beta_and_refuses_flat_times():
    from course_lib.benchmarks.long_sequences import all_to_all_model
    from course_lib.cost_models import all_to_all_time

    sizes = [1e3, 1e4, 1e5, 1e6]
    seconds = [float(all_to_all_time(n, 4, 2e-4, 1e-9)) for n in sizes]
    assert all_to_all_model(sizes, seconds, 4) == pytest.approx((2e-4, 1e-9))
    with pytest.raises(ValueError, match="did not take longer with more bytes"):
        all_to_all_model(sizes, [2e-3, 1.5e-3, 1.2e-3, 1e-3], 4)  # shorter with more bytes


def exchanged(group=None):
    """Rank r's vector [10 r, 10 r + 1, 10 r + 2, 10 r + 3], all-to-all'd over two ranks."""
    import torch.distributed as dist

    from course_lib.benchmarks.long_sequences import flat_all_to_all

    return flat_all_to_all(torch.arange(4.0) + 10 * dist.get_rank(group), group)


def test_the_flat_all_to_all_sends_slice_s_to_rank_s():
    from course_lib import launch

    got = launch(exchanged, 2, backend="gloo")
    torch.testing.assert_close(got[0], torch.tensor([0.0, 1.0, 10.0, 11.0]))
    torch.testing.assert_close(got[1], torch.tensor([2.0, 3.0, 12.0, 13.0]))
