"""Training a small GPT under every plan (course_lib.train_gpt): each equals one process."""

import os
import subprocess
import sys

import pytest
import torch

from course_lib import launch
from course_lib import train_gpt as T

KW = dict(steps=3, global_batch=8, dtype=torch.float64)


@pytest.fixture(scope="module")
def one_process():
    return {r: T.train_one_process(recompute=r, **KW) for r in (False, True)}


def _same_losses(results, baseline):
    for r in results:
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(baseline["losses"]),
                                   rtol=1e-10, atol=1e-12, msg=f"rank {r['rank']}")


PLANS_2 = {
    "data": dict(dp=2),
    "tensor": dict(tp=2),
    "pipeline": dict(pp=2, micro_batches=2),
    "ZeRO-1": dict(dp=2, zero=1),
    "ZeRO-2": dict(dp=2, zero=2),
    "ZeRO-3 (FSDP)": dict(dp=2, zero=3),
    "data, accumulation, recomputation": dict(dp=2, micro_batches=2, recompute=True),
    "pipeline, recomputation": dict(pp=2, micro_batches=4, recompute=True),
    "context (ring attention)": dict(cp=2),
    "context, ZeRO-1": dict(cp=2, zero=1),
    "context, ZeRO-3 (FSDP)": dict(cp=2, zero=3),
    "context, recomputation": dict(cp=2, recompute=True),
}


@pytest.mark.parametrize("name", PLANS_2)
def test_every_strategy_on_two_ranks_equals_one_process(name, one_process):
    plan = PLANS_2[name]
    results = launch(T.train, world_size=2, kwargs={**plan, **KW})
    _same_losses(results, one_process[False])
    # rank = ((d pp + s) cp + c) tp + t: tensor-parallel innermost, then context, pipeline, data
    pp, cp, tp = (plan.get(name, 1) for name in ("pp", "cp", "tp"))
    assert [(r["dp"], r["pp"], r["cp"], r["tp"]) for r in results] == [
        (i // (pp * cp * tp), i // (cp * tp) % pp, i // tp % cp, i % tp) for i in range(2)]


def test_what_each_rank_holds_follows_the_plan(one_process):
    whole = one_process[False]["state"]
    tp, = [launch(T.train, world_size=2, kwargs={"tp": 2, **KW})]
    fsdp = launch(T.train, world_size=2, kwargs={"dp": 2, "zero": 3, **KW})
    zero1 = launch(T.train, world_size=2, kwargs={"dp": 2, "zero": 1, **KW})
    context = launch(T.train, world_size=2, kwargs={"cp": 2, **KW})
    for r in tp:  # the blocks' matrices are split; embeddings, norms and the head are not
        assert 0.5 * whole["params"] < r["state"]["params"] < 0.6 * whole["params"]
    for r in fsdp:  # FSDP shards every parameter, gradient and moment
        assert r["state"]["params"] == pytest.approx(whole["params"] / 2, rel=0.01)
        assert r["state"]["grads"] == pytest.approx(whole["grads"] / 2, rel=0.01)
    for r in zero1:  # ZeRO-1 shards only the moments (and pads the shard)
        assert r["state"]["params"] == whole["params"]
        assert r["state"]["optimizer"] == pytest.approx(whole["optimizer"] / 2, rel=0.01)
    for r in context:  # each rank keeps half of each sequence's activations, all the weights
        assert r["state"]["params"] == whole["params"]
        assert r["activations"] < 0.6 * one_process[False]["activations"]
    # recomputation keeps far fewer activations than one process without it
    assert one_process[True]["activations"] < 0.3 * one_process[False]["activations"]


@pytest.mark.parametrize("plan", [dict(dp=2, tp=2), dict(tp=2, pp=2, micro_batches=2),
                                  dict(dp=2, pp=2, micro_batches=2, zero=1),
                                  dict(dp=2, cp=2, zero=3), dict(cp=2, tp=2),
                                  dict(cp=2, pp=2, micro_batches=2), dict(cp=4)],
                         ids=["data x tensor", "tensor x pipeline", "data x pipeline, ZeRO-1",
                              "data x context, ZeRO-3", "context x tensor",
                              "context x pipeline", "context over 4"])
def test_hybrids_on_four_oversubscribed_ranks_equal_one_process(plan, one_process):
    results = launch(T.train, world_size=4, kwargs={**plan, **KW})
    _same_losses(results, one_process[False])


@pytest.mark.parametrize("change, message", [
    (dict(dp=3, world=2), "start dp x tp x pp processes"),
    (dict(tp=3), "tp = 3 must divide the 4 heads"),
    (dict(pp=3, micro_batches=3), "pp = 3 does not divide the 4 layers"),
    (dict(dp=2, micro_batches=5), "must split into dp x micro_batches"),
    (dict(pp=2, micro_batches=1), "1F1B needs at least as many micro-batches"),
    (dict(pp=2, micro_batches=2, zero=3), "ZeRO-3"),
    (dict(zero=4), "zero must be"),
    (dict(dp=0), "at least 1"),
    (dict(cp=0), "at least 1"),
    (dict(cp=2, world=2, seq=30), r"zigzag\) split cuts each sequence into 2 x cp = 4 equal"),
    (dict(cp=3), r"2 x cp = 6 equal chunks: 32 tokens"),
    (dict(cp=2, world=2, dp=2), r"dp x cp x tp x pp = 2 x 2 x 1 x 1 = 4, but the job has 2"),
    (dict(dp=2, ep=2), "ep = 2 spreads a model's experts, and this one has none"),
    (dict(dp=3, ep=3, experts=4), "ep = 3 does not divide the 4 experts"),
    (dict(dp=2, ep=4, experts=4, world=2), "ep = 4 must divide dp = 2"),
    (dict(dp=2, ep=2, experts=4, zero=1), "with ep > 1 their experts differ: use zero 0"),
    (dict(tp=2, experts=4), "use tp = 1 with experts"),
    (dict(ep=0), "at least 1"),
])
def test_a_plan_that_cannot_run_exactly_is_refused_with_what_to_change(change, message):
    plan = dict(dp=1, tp=1, pp=1, cp=1, ep=1, zero=0, micro_batches=1)
    world, seq = change.pop("world", None), change.pop("seq", 32)
    experts = change.pop("experts", 0)
    plan.update(change)
    world = world or plan["dp"] * plan["tp"] * plan["pp"] * plan["cp"]
    with pytest.raises(ValueError, match=message):
        T.check_plan(world, global_batch=12, layers=4, heads=4, seq=seq, experts=experts, **plan)


@pytest.mark.parametrize("sizes, message", [
    (dict(steps=0), "steps must be at least 1"), (dict(steps=-2), "steps must be at least 1"),
    (dict(global_batch=0), "at least one sequence"),
])
def test_nothing_to_do_is_refused_before_any_work(sizes, message):
    with pytest.raises(ValueError, match=message):
        T.train_one_process(**sizes)
    with pytest.raises(ValueError, match=message):  # before it asks for a process group
        T.train(**sizes)


@pytest.mark.parametrize("model, message", [
    (dict(experts=4, top_k=0), "top_k between 1"), (dict(experts=-2), "experts = -2"),
    (dict(d_model=0, heads=0), "d_model, heads must be at least 1, got 0, 0")])
def test_a_model_that_cannot_be_built_is_refused_before_any_work(model, message):
    with pytest.raises(ValueError, match=message):
        T.train_one_process(**model)
    with pytest.raises(ValueError, match=message):  # before it asks for a process group
        T.train(**model)


def test_saved_bytes_counts_each_storage_once_and_lets_it_go():
    saved = T.SavedBytes()
    w = torch.nn.Parameter(torch.randn(4, 4))
    x = torch.randn(3, 4, requires_grad=True)
    with saved.hooks():
        y = x @ w  # saves x (counted) and w (a parameter: not counted)
        z = (y * y).sum()  # saves y twice: one storage
    assert saved.peak == saved.now == x.untyped_storage().nbytes() + y.untyped_storage().nbytes()
    z.backward()
    del y, z
    assert saved.now == 0 and saved.refs == {}


def test_the_plan_runs_under_torchrun():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "course_lib.train_gpt", "--tp", "2", "--steps", "3", "--global-batch", "8"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("loss per step:"))
    losses = [float(v) for v in line.split(":")[1].split()]
    expected = T.train_one_process(steps=3, global_batch=8)["losses"]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), atol=2e-4, rtol=0)
    assert "plan: dp 1 x tp 2 x pp 1, ZeRO-0, m 1; 2 ranks" in done.stdout
    assert "CPU thread(s) per rank" in done.stdout


def test_the_module_runs_through_launch_from_the_command_line(capsys, monkeypatch):
    monkeypatch.delenv("COURSE_LIB_THREADS", raising=False)
    results = T.main(["--world-size", "2", "--dp", "2", "--steps", "2", "--global-batch", "4"])
    assert [r["rank"] for r in results] == [0, 1] and len(results[0]["losses"]) == 2
    out = capsys.readouterr().out
    assert "plan: dp 2 x tp 1 x pp 1, ZeRO-0, m 1; 2 ranks" in out
    assert "median step of the slowest rank" in out and "most memory on one rank" in out
    # the one-rank baseline is timed with the threads each of the two ranks had, and says so
    one = T.main(["--steps", "2", "--global-batch", "4"])
    assert "; 1 ranks" in capsys.readouterr().out
    assert [r["threads"] for r in one + results] == [1, 1, 1]
    assert "ms, 1 CPU thread(s) per rank" in out


@pytest.fixture(scope="module")
def with_experts():
    return {k: T.train_one_process(experts=4, top_k=k, **KW) for k in (1, 2)}


@pytest.mark.parametrize("k, plan, ranks", [
    (1, dict(dp=2), 2), (1, dict(dp=2, ep=2), 2), (2, dict(dp=2, ep=2), 2),
    (1, dict(pp=2, micro_batches=2), 2), (2, dict(cp=2), 2),
    (1, dict(dp=4, ep=2), 4), (2, dict(dp=4, ep=4), 4), (1, dict(dp=2, ep=2, cp=2), 4),
    (2, dict(dp=2, ep=2, pp=2, micro_batches=2), 4)],
    ids=["data, k 1", "experts over 2, k 1", "experts over 2, k 2", "pipeline", "context, k 2",
         "2 expert groups of 2", "experts over 4, k 2", "experts x context",
         "experts x pipeline, k 2"])
def test_a_gpt_with_experts_on_every_plan_equals_one_process(k, plan, ranks, with_experts):
    results = launch(T.train, world_size=ranks, kwargs={**plan, "experts": 4, "top_k": k, **KW})
    _same_losses(results, with_experts[k])
    whole = with_experts[k]["state"]["params"]
    for r in results:  # each rank of an expert group keeps its share of every block's experts
        if plan.get("ep", 1) > 1 and plan.get("pp", 1) == 1:
            assert r["state"]["params"] < (0.3 + 0.7 / plan["ep"]) * whole


def test_experts_make_another_model_and_run_from_the_command_line(capsys, with_experts):
    dense = T.train_one_process(**KW)
    assert with_experts[1]["state"]["params"] > 2.5 * dense["state"]["params"]  # 4 MLPs a block
    assert with_experts[1]["losses"][1:] != pytest.approx(dense["losses"][1:], rel=1e-3)
    results = T.main(["--dp", "2", "--ep", "2", "--experts", "4", "--top-k", "2", "--steps", "2",
                      "--global-batch", "4"])
    assert "plan: dp 2 x tp 1 x pp 1, ep 2, ZeRO-0, m 1; 2 ranks" in capsys.readouterr().out
    expected = T.train_one_process(steps=2, global_batch=4, experts=4, top_k=2)["losses"]
    torch.testing.assert_close(torch.tensor(results[0]["losses"]), torch.tensor(expected),
                               atol=2e-4, rtol=0)


BF16 = dict(steps=3, global_batch=8, precision="bf16")


@pytest.fixture(scope="module")
def in_bf16():
    return T.train_one_process(**BF16)


@pytest.mark.parametrize("plan", [dict(dp=2), dict(tp=2), dict(pp=2, micro_batches=2),
                                  dict(dp=2, zero=1), dict(dp=2, zero=3), dict(cp=2)],
                         ids=["data", "tensor", "pipeline", "ZeRO-1", "FSDP2, bf16 policy",
                              "context"])
def test_bf16_mixed_precision_under_every_plan_is_within_0_2_percent_of_one_process(plan,
                                                                                     in_bf16):
    results = launch(T.train, world_size=2, kwargs={**plan, **BF16})
    for r in results:  # the stated tolerance: 0.2% of the loss (bf16 has 8 bits of mantissa)
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(in_bf16["losses"]),
                                   rtol=2e-3, atol=0)


def test_bf16_keeps_float32_masters_and_saves_activations_in_bf16(in_bf16):
    fp32 = T.train_one_process(steps=3, global_batch=8)
    assert in_bf16["state"] == fp32["state"]  # parameters, gradients, Adam: float32
    assert in_bf16["activations"] < 0.8 * fp32["activations"]  # matrix inputs kept in bf16
    two = {p: launch(T.train, world_size=2, kwargs=dict(dp=2, steps=2, global_batch=8,
                                                        precision=p)) for p in ("fp32", "bf16")}
    assert two["bf16"][0]["activations"] < 0.85 * two["fp32"][0]["activations"]
    with pytest.raises(ValueError, match="precision must be 'fp32' or 'bf16', got 'fp16'"):
        T.train_one_process(precision="fp16")
    with pytest.raises(ValueError, match="bf16 mixed precision keeps float32 masters"):
        T.train(precision="bf16", dtype=torch.float64)


def test_context_parallelism_in_bf16_runs_from_the_command_line(capsys):
    results = T.main(["--cp", "2", "--steps", "2", "--global-batch", "4", "--precision", "bf16"])
    assert "plan: dp 1 x cp 2 x tp 1 x pp 1, ZeRO-0, m 1; 2 ranks, bf16" in capsys.readouterr().out
    assert [r["cp"] for r in results] == [0, 1]
    expected = T.train_one_process(steps=2, global_batch=4, precision="bf16")["losses"]
    torch.testing.assert_close(torch.tensor(results[0]["losses"]), torch.tensor(expected),
                               rtol=2e-3, atol=0)  # bf16's tolerance (see above)


@pytest.mark.parametrize("argv, message", [
    (["--world-size", "2"], "alone does not say how to split the ranks: give --dp, --tp, --pp "
                            "and --cp whose product is 2 (e.g. --dp 2)"),
    (["--world-size", "4", "--tp", "2"], "dp x tp x pp = 1 x 2 x 1 = 2; make them agree"),
    (["--steps", "0"], "steps must be at least 1, got 0"),
    (["--global-batch", "0"], "the global batch must hold at least one sequence, got 0"),
    (["--tp", "3"], "tp = 3 must divide the 4 heads"),
    (["--dp", "2", "--global-batch", "5"], "must split into dp x micro_batches"),
    (["--world-size", "2", "--cp", "2", "--dp", "2"], "dp x cp x tp x pp = 2 x 2 x 1 x 1 = 4"),
    (["--lr", "-1"], "--lr must be positive and finite, got -1.0"),
    (["--lr", "inf"], "--lr must be positive and finite, got inf"),
    (["--d-model", "10"], "d_model (10) must be a multiple of heads (4)"),
    (["--vocab", "2"], "vocab (2) must be at least the 96 characters"),
    (["--cp", "3"], "2 x cp = 6 equal chunks: 32 tokens do not split so"),
    (["--experts", "-1"], "got experts = -1, top_k = 1"),
    (["--experts", "4", "--top-k", "5"], "top_k between 1 and the experts"),
    (["--top-k", "2"], "(1 without experts), got experts = 0, top_k = 2"),
    (["--experts", "4", "--tp", "2"], "use tp = 1 with experts"),
    (["--context", "0"], "context must be at least 1, got 0"),
])
def test_a_world_size_that_is_not_the_plans_is_refused_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        T.main(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_torchrun_with_another_number_of_processes_is_refused_before_any_group(monkeypatch,
                                                                             capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun --nproc-per-node 2 sets it
    with pytest.raises(SystemExit) as stopped:
        T.main(["--cp", "2", "--dp", "2"])
    assert stopped.value.code == 2
    assert ("torchrun started 2 processes, but dp x cp x tp x pp = 2 x 2 x 1 x 1 = 4: start 4"
            in capsys.readouterr().err)


def test_train_takes_the_planners_plan_as_it_is(one_process):
    from course_lib.plans import Plan

    results = launch(T.train, world_size=2, kwargs={"plan": Plan(dp=1, tp=2, pp=1), **KW})
    _same_losses(results, one_process[False])
    assert [(r["dp"], r["pp"], r["tp"]) for r in results] == [(0, 0, 0), (0, 0, 1)]


def test_train_gpt_is_assembled_from_the_lessons_own_parts():
    from course_lib import (
        context_parallel,
        memory,
        overlap,
        pipelining,
        sharding,
        tensor_parallel,
        zero,
    )

    # each stage's blocks are Megatron's f and g (lesson 5), 1F1B is torch's (lessons 5, 11)
    assert pipelining.ParallelBlock is tensor_parallel.ParallelBlock
    assert T.StageModule is pipelining.StageModule
    assert T.ring_attention is context_parallel.ring_attention  # lesson 13
    assert T.all_reduce_as_one_bucket is overlap.all_reduce_as_one_bucket  # lesson 10
    assert T.ShardedAdam is zero.ShardedAdam and T.fully_shard_blocks is sharding.fully_shard_blocks
    assert T.SavedBytes is memory.SavedBytes  # lesson 11's counter of saved activations


def test_a_stage_module_refuses_blocks_its_stages_cannot_share_equally():
    from course_lib.models import tiny_gpt
    from course_lib.pipelining import StageModule

    gpt = tiny_gpt(d_model=8, layers=3, heads=2, context=4)
    assert [len(StageModule(gpt, s, 3, 0, 1).blocks) for s in range(3)] == [1, 1, 1]
    for pp in (2, 4, 0):  # 2 would drop a block, 4 and 0 would leave stages without one
        with pytest.raises(ValueError, match=f"pp = {pp} stages cannot share 3 blocks equally"):
            StageModule(gpt, 0, pp, 0, 1)


def _off_and_on(plan):
    from course_lib.runtime.emulation import EmulatedDevice

    off = T.train(**plan, **KW)
    on = T.train(**plan, **KW, emulated=EmulatedDevice(1e12, "a test"))
    return off, on


@pytest.mark.parametrize("plan", [dict(tp=2), dict(pp=2, micro_batches=2), dict(dp=2, zero=3)],
                         ids=["tensor", "pipeline", "FSDP"])
def test_on_an_emulated_device_every_plan_gives_the_same_numbers(plan, one_process):
    from course_lib.runtime.emulation import EmulatedDevice

    for off, on in launch(_off_and_on, world_size=2, args=(plan,)):
        assert on["losses"] == off["losses"]  # the same operations in the same order
        assert on["emulated"]["device_seconds"] > 0 and off["emulated"] is None
        assert sum(on["waited"]) == pytest.approx(on["emulated"]["lag"]) and not any(off["waited"])
    alone = T.train_one_process(**KW, emulated=EmulatedDevice(1e12))
    assert alone["losses"] == one_process[False]["losses"]
    assert alone["emulated"]["label"] == "emulated device"
