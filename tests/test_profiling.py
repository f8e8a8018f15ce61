"""What a step spends its time on (course_lib.runtime.profiling), the overlap model
(course_lib.cost_models) and lesson 10's benchmark run (course_lib.benchmarks.overlap)."""

import functools
import shutil

import pytest
import torch

from course_lib import cost_models
from course_lib.benchmarks import overlap as bench
from course_lib.benchmarks.systems import reference_system
from course_lib.data import stdlib_text, text_batch
from course_lib.models import tiny_gpt
from course_lib.runtime import launch, profiling
from course_lib.runtime.emulation import flops_of
from course_lib.runtime.timing import Span


def test_messages_go_one_at_a_time_when_ready():
    spans = cost_models.overlapped_messages([0.0, 0.1, 0.1, 5.0], [10, 10, 20, 0], 0.5, 0.1)
    flat = [t for span in spans for t in span]
    assert flat == pytest.approx([0.0, 1.5, 1.5, 3.0, 3.0, 5.5, 5.5, 6.0])
    # backward ends at 3: 3 of the 6 seconds of messages lie before it
    assert cost_models.hidden_fraction_model([0.0, 0.1, 0.1, 5.0], [10, 10, 20, 0], 0.5, 0.1,
                                             3.0) == pytest.approx(3.0 / 6.0)


def test_hidden_fraction_counts_communication_under_backward_once():
    spans = [Span(0, 0.0, 1.0, "forward"), Span(0, 1.0, 2.0, "backward"),
             Span(1, 1.5, 1.0, "all-reduce"), Span(1, 2.0, 1.0, "all-reduce"),  # union 1.5-3
             Span(2, 0.0, 9.0, "backward")]  # another rank's lanes are not counted
    assert profiling.hidden_fraction(spans, lane=0) == pytest.approx(1.5 / 1.5)
    spans.append(Span(1, 3.0, 1.5, "all-reduce"))
    assert profiling.hidden_fraction(spans, lane=0) == pytest.approx(1.5 / 3.0)
    assert profiling.hidden_fraction(spans[:2], lane=0) != profiling.hidden_fraction(spans, 0)


def test_a_profiled_step_has_its_phases_in_order_and_a_table_and_a_trace():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    def step():
        with profiling.phase("forward"):
            loss = model(torch.randn(4, 8)).sum()
        with profiling.phase("backward"):
            loss.backward()

    prof, _ = profiling.profile(step)
    spans = profiling.step_spans(prof, lane=3)
    assert [s.kind for s in spans][:2] == ["forward", "backward"]
    assert {s.lane for s in spans} == {6} and spans[0].start == 0
    assert spans[1].start >= spans[0].start + spans[0].duration
    table = profiling.operator_table(prof, top=3)
    lines = table.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("---")]
    rows = lines[rules[1] + 1:rules[2]]  # between the header and the end
    assert "Self CPU" in table and len(rows) == 3, table
    path = profiling.export_trace(prof)
    assert path.exists() and '"traceEvents"' in path.read_text()
    shutil.rmtree(path.parent)  # a student keeps the trace; the test leaves nothing behind
    assert profiling.lane_names(2) == {0: "rank 0 compute", 1: "rank 0 all-reduce",
                                       2: "rank 1 compute", 3: "rank 1 all-reduce"}
    with pytest.raises(ValueError, match="no labelled phase"):
        profiling.step_spans(profiling.profile(lambda: torch.ones(2) + 1)[0])


def test_the_benchmark_run_profiles_all_reduces_on_both_ranks():
    runs = launch(bench.run, 2, kwargs=dict(configs=(("after backward", None), ("buckets", 1.0)),
                                            steps=1, warmup=1, repeats=1))
    s = bench.summarise(runs)
    assert set(s["medians"]) == {"none", "after backward", "buckets 1 MB"}
    for name in ("after backward", "buckets 1 MB"):
        lanes = {sp.lane for sp in s["spans"][name] if sp.kind == "all-reduce"}
        assert lanes == {1, 3}, name  # both ranks' gloo threads were seen
    assert not any(sp.kind == "all-reduce" for sp in s["spans"]["none"])
    assert 0 <= s["measured"]["buckets 1 MB"] <= 1 and 0 <= s["predicted"]["buckets 1 MB"] <= 1
    # fitted to one stream of messages: its values depend on the machine's load, not on the code
    assert s["alpha"] >= 0 and s["beta"] >= 0
    # the stream: the gradients as (a) sends them, the fixed sizes, all gradients as one message
    sizes = set(s["gradient_bytes"]) | set(bench.MESSAGE_BYTES) | {sum(s["gradient_bytes"])}
    assert s["message_sizes"] == sorted(sizes) and len(s["message_seconds"]) == len(sizes)
    assert s["copy_per_byte"] > 0  # the host's bucket copies, timed beside the steps
    assert len(s["ready"]) == len(s["gradient_bytes"]) == 54
    assert sum(s["gradient_bytes"]) == 4 * sum(p.numel() for p in bench.model_fn().parameters())


def test_the_benchmark_run_profiles_only_the_configs_asked_for():
    runs = launch(bench.run, 2, kwargs=dict(configs=(("after backward", None), ("buckets", 1.0)),
                                            steps=1, warmup=0, repeats=1,
                                            profiled=["buckets 1 MB"]))
    s = bench.summarise(runs)
    assert set(s["spans"]) == {"buckets 1 MB"} and set(s["measured"]) == {"buckets 1 MB"}
    assert set(s["predicted"]) == {"buckets 1 MB"}  # the model needs no profile


def test_bucket_copy_seconds_packs_and_unpacks_every_gradient_unchanged():
    grads = [torch.arange(6.0).reshape(2, 3), torch.ones(4)]
    seconds = bench.bucket_copy_seconds(grads)
    assert seconds > 0
    # packed for two ranks (divided by 2, as start_bucket divides) and unpacked in place
    torch.testing.assert_close(grads[0], torch.arange(6.0).reshape(2, 3) / 2)
    torch.testing.assert_close(grads[1], torch.full((4,), 0.5))


SMALL_GPT = functools.partial(tiny_gpt, vocab=96, d_model=64, layers=2, heads=2, context=8)


def _stream(group=None):
    calls = []
    out = bench.message_times([1024, 4096, 1024], 2, group, torch.device("cpu"),
                              before=lambda: calls.append(1))
    return out, len(calls)


def test_message_times_time_each_message_of_a_stream_after_the_compute_before_it():
    for out, calls in launch(_stream, 2):
        assert calls == 3  # a warm-up stream, then two timed ones
        assert sorted(out) == [1024, 4096]
        assert len(out[1024]) == 4 and len(out[4096]) == 2  # every message of every timed stream
        assert all(t > 0 for ts in out.values() for t in ts)


def test_the_benchmark_runs_on_an_emulated_device_chosen_by_the_ratio():
    runs = launch(bench.run, 2, kwargs=dict(configs=(("buckets", 1.0),), steps=1, warmup=1,
                                            repeats=1, model=SMALL_GPT, local_batch=1,
                                            context=8, ratio=0.01, stands_for="a test"))
    e = bench.summarise(runs)["emulated"]
    flops, _ = flops_of(bench.one_step, SMALL_GPT(), lambda: None,
                        *text_batch(stdlib_text(), 1, 8, torch.Generator().manual_seed(0)), 1e-3)
    assert e["ratio"] == e["achieved"] == 0.01 and e["flops"] == flops  # every rank: same FLOPs
    # the rate makes the step's all-gradient all-reduce 1% of the device's compute
    assert e["flops"] / e["flops_per_second"] == pytest.approx(e["communication"] / 0.01)
    assert e["lag"] >= 0 and e["unmodelled"] > 0  # the SGD update has no FLOPs
    # a ratio this CPU cannot stand for: the run takes the largest it can and says so
    slow = bench.summarise(launch(bench.run, 2, kwargs=dict(
        configs=(), steps=1, warmup=1, repeats=1, model=SMALL_GPT, local_batch=1, context=8,
        ratio=100.0, profiled=False)))["emulated"]
    assert slow["ratio"] == 100.0 and 0 < slow["achieved"] < 100.0
    assert slow["flops"] / slow["flops_per_second"] == pytest.approx(
        slow["communication"] / slow["achieved"])
    assert slow["flops"] / slow["flops_per_second"] > 2 * slow["compute_cpu"]


@pytest.mark.parametrize("kwargs, named", [
    (dict(steps=0), "steps"), (dict(repeats=-1), "repeats"), (dict(local_batch=1.5), "local_batch"),
    (dict(warmup=-1), "warmup"), (dict(warmup=0, ratio=0.5), "first step counts FLOPs")])
def test_the_benchmark_refuses_sizes_it_cannot_time_naming_them(kwargs, named):
    # refused before any rank is needed; an emulated run's first step only counts FLOPs, so a run
    # without warm-up would time an unpaced step
    with pytest.raises(ValueError, match=named):
        bench.run(**kwargs)


def test_the_command_prints_the_ratio_it_ran_beside_the_one_its_system_asks_for(monkeypatch,
                                                                                 capsys):
    monkeypatch.setattr(bench, "EMULATED", dict(  # a small run: two configs, one repeat
        model=SMALL_GPT, local_batch=1, context=8, repeats=1, message_repeats=1, profiled=False,
        configs=(("after backward", None), ("buckets", 1.0))))
    s = bench.main(["--steps", "2", "--emulated"])
    out = capsys.readouterr().out
    e = s["emulated"]
    assert e["ratio"] == reference_system()["ratio"] and 0 < e["achieved"] <= e["ratio"]
    assert (f"communication / compute = {e['achieved']:.3f} ({reference_system()['name']}: "
            f"{e['ratio']:.3f})") in out
    assert "buckets 1 MB" in out and "best overlapped step / (a)" in out
