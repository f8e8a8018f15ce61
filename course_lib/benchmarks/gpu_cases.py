"""The cases of the GPU acceptance script (:mod:`course_lib.benchmarks.gpu_check`): one function
per lesson, run on every rank, returning (a result whose tensors must live on the GPU, what was
checked). Each checks its lesson's rank functions against a cheap reference where there is one."""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.runtime.devices import device


def _hello():
    from course_lib.hello import expected_sum, hello_all_reduce

    out = hello_all_reduce()
    assert out["all_reduce_sum"] == expected_sum(dist.get_world_size()), out
    return torch.tensor(out["all_reduce_sum"], device=device()), "sum right"


def _all_reduces():
    from course_lib import collectives as C

    p, x = dist.get_world_size(), torch.arange(10.0) + dist.get_rank()
    want = sum(torch.arange(10.0) + r for r in range(p)).to(device())
    for name, fn in {**C.ALL_REDUCES, "torch": C.torch_all_reduce}.items():
        got = fn(x)[0]
        torch.testing.assert_close(got, want, msg=name)
    C.time_all_reduce(C.ring_all_reduce, [1024], repeats=2)
    return got, "5 all-reduces equal the sum; timed"


def _data_parallel():
    from course_lib import data_parallel as dp
    from course_lib.data import load_digits
    from course_lib.models import digits_cnn

    split = load_digits(images=True)
    x, y, model_fn = split.x_train[:256], split.y_train[:256], digits_cnn
    a = dp.train_from_scratch(model_fn, x, y, 16, 0.05)["params"]
    b = dp.train_ddp(model_fn, x, y, 16, 0.05)["params"]
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    dp.train_ddp(model_fn, x, y, 16, 0.05, comm_hook=dp.compression_hook(torch.float16))
    dp.time_ddp_steps(model_fn, x, y, 16, steps=2, warmup=1)
    return a, "by hand = DDP; fp16 hook; timed"


def _pipeline():
    from course_lib import pipeline as pp
    from course_lib.models import mlp

    p = dist.get_world_size()
    model = mlp((64, 32, 32, 32, 10), activation=torch.nn.Tanh, dtype=torch.float64)
    pieces = pp.split_into_stages(model, p)
    x = torch.randn(16, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.arange(16) % 10
    ours = pp.run_pipeline(pieces, x, y, 4, "1F1B")
    if p > 1:
        theirs = pp.run_torch_pipeline(pp.split_into_stages(model, p), x, y, 4, "1F1B")
        for a, b in zip(ours["grads"], theirs["grads"], strict=True):
            torch.testing.assert_close(a, b)
    return ours["grads"], "hand-written 1F1B" + (" = torch.distributed.pipelining" if p > 1
                                                  else "")


def _tensor_parallel():
    from course_lib import sharding
    from course_lib import tensor_parallel as tp
    from course_lib.models import feed_forward, mlp

    model, g = feed_forward(), torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, dtype=torch.float64, generator=g)
    out = tp.run_megatron_mlp(model, x, torch.zeros(6, 16, dtype=torch.float64))["out"]
    torch.testing.assert_close(out, feed_forward()(x).to(device()))
    dt = tp.run_dtensor_mlp(feed_forward(), x)["out"]
    torch.testing.assert_close(dt, out)
    sharding.fsdp_parameter_bytes(lambda: mlp((32, 64, 8)))
    return out, "Megatron MLP = unsplit = DTensor; FSDP2 trains"


def _parameter_server_and_gossip():
    from course_lib import decentralized as dec
    from course_lib import parameter_server as ps
    from course_lib.erm import diabetes_problem

    problem, p = diabetes_problem(), dist.get_world_size()
    log = ps.parameter_server(problem, ps.sgd(0.1), mode="async", batch=16, gradients=20)
    graph = {i: sorted({(i - 1) % p, (i + 1) % p}) for i in range(p)}
    run = dec.decentralized_sgd(problem, graph, steps=5, lr=0.1)
    local = dec.local_sgd(problem, local_steps=2, rounds=2, lr=0.1, batch=16)
    steps = log.get("steps", len(log.get("staleness", [])))
    return [run["iterates"], local["averaged"]], f"parameter server ({steps} gradients), " \
        f"gossip and local SGD"


def _precision():
    from course_lib import mixed_precision as mp
    from course_lib import quantization as qz
    from course_lib.data import load_digits

    x = torch.randn(1000, generator=torch.Generator().manual_seed(dist.get_rank()))
    sums = [qz.compressed_all_reduce(x, m)["sum"] for m in qz.METHODS]
    split = load_digits()
    runs = [mp.train(split, precision, epochs=1, device=str(device()))
            for precision in ("bf16", "fp16 + loss scaling")]
    return sums, f"{len(sums)} compressed all-reduces; autocast accuracy " + \
        ", ".join(f"{r['accuracy'][-1]:.2f}" for r in runs)


def _federated():
    from course_lib import federated as fl
    from course_lib import partitions as pt
    from course_lib.data import load_digits

    split = load_digits()
    parts = pt.iid(split.y_train.numpy(), 8)
    local = fl.LocalTraining(epochs=1, batch=10, lr=0.1)
    log = fl.federated(split, parts, local,
                       fl.Federation(rounds=2, fraction=0.5, scaffold=True))
    return log["params"], f"FedAvg + SCAFFOLD on ranks, accuracy {log['accuracy'][-1]:.2f}"


def _fast_data_parallel():
    import functools

    from course_lib import compression as cp
    from course_lib import overlap as ov
    from course_lib import recomputation as rc
    from course_lib.data import load_digits, stdlib_text, text_batch
    from course_lib.models import digits_mlp, tiny_gpt
    from course_lib.runtime import profiling

    gpt = functools.partial(tiny_gpt, d_model=32, layers=2, heads=2, context=16)
    x, y = text_batch(stdlib_text(20_000), 32, 16, torch.Generator().manual_seed(0))
    p = dist.get_world_size()
    params = {sync: ov.train(gpt, x, y, 4 * p, 3, 0.1, sync=sync, bucket_mb=0.01)["params"]
              for sync in ov.SYNCS}
    for sync, got in params.items():
        torch.testing.assert_close(got, params["after backward"], atol=1e-4, rtol=1e-4,
                                   msg=sync)
    model, wait = ov.synchronizer(gpt().to(device()), "buckets", 0.01)
    xb, yb = x[:4].to(device()), y[:4].to(device())

    from course_lib.benchmarks.overlap import one_step

    one_step(model, wait, xb, yb)
    prof, _ = profiling.profile(lambda: one_step(model, wait, xb, yb))
    spans = profiling.step_spans(prof, lane=dist.get_rank())
    comm = sum(s.kind == profiling.COMM for s in spans)
    split = load_digits()
    ef = cp.train(functools.partial(digits_mlp, width=32, depth=1), split.x_train,
                  split.y_train, split.x_test, split.y_test, cp.PowerSGD(2), True, 32 * p, 20,
                  0.1)
    plain = gpt().to(device())
    peak = rc.peak_step_memory(plain, xb, yb)
    return params["buckets"], (f"4 syncs agree; profiled {comm} all-reduce bars; PowerSGD+EF "
                               f"accuracy {ef['accuracy']:.2f}; peak {peak['total'] / 1e6:.1f} MB")


def _memory_and_sharding():
    import functools

    from course_lib import interleaving as il
    from course_lib import memory as M
    from course_lib import sharding as S
    from course_lib import zero as Z
    from course_lib.data import stdlib_text, text_batch
    from course_lib.models import mlp, tiny_gpt

    gpt = functools.partial(tiny_gpt, d_model=32, layers=2, heads=2, context=16)
    x, y = text_batch(stdlib_text(20_000), 32, 16, torch.Generator().manual_seed(0))
    p = dist.get_world_size()
    runs = {stage: Z.train(gpt, x, y, 4 * p, 3, stage=stage) for stage in Z.STAGES}
    for stage in (1, 2):
        torch.testing.assert_close(runs[stage]["params"], runs[0]["params"], atol=1e-4,
                                   rtol=1e-4, msg=f"ZeRO-{stage}")
    fsdp = S.train_fsdp(gpt, x, y, 4 * p, 3)
    peak = M.measure_step(gpt().to(device()), x[:4].to(device()), y[:4].to(device()))
    pieces = [torch.nn.Sequential(*list(mlp((12, 10, 10, 10, 4)))[2 * i:2 * i + 2])
              for i in range(2 * p)]
    il.run(pieces, torch.randn(8, 12), torch.randint(0, 4, (8,)), 2 * p)
    return runs[1]["params"], (f"ZeRO-1/2 = Adam; FSDP2 {fsdp['state']['params']:,} B of params"
                               f" here; step peak {peak['total'] / 1e6:.1f} MB; interleaved 1F1B")


def _choosing_a_strategy():
    from course_lib import train_gpt as T
    from course_lib.models import tiny_gpt
    from course_lib.tensor_parallel import ParallelBlock

    p, kw = dist.get_world_size(), dict(steps=3, global_batch=8, d_model=32, layers=2, context=16)
    plans = [dict(dp=p)] + ([dict(tp=2), dict(pp=2, micro_batches=2), dict(dp=2, zero=3),
                             dict(cp=2)] if p == 2 else [])
    base = torch.tensor(T.train_one_process(**kw)["losses"])  # CPU, float32
    for plan in plans:
        got = torch.tensor(T.train(**plan, **kw)["losses"])
        torch.testing.assert_close(got, base, atol=1e-3, rtol=1e-3, msg=str(plan))
    block = ParallelBlock(tiny_gpt(d_model=32, layers=1).blocks[0], dist.get_rank(), p)
    out = block.to(device())(torch.randn(2, 4, 32, device=device()))
    return out, f"{len(plans)} plans of train_gpt = one process; a tensor-parallel block"


def _long_sequences_and_experts():
    from course_lib import context_parallel as cp
    from course_lib import experts as ex
    from course_lib.ulysses import ulysses_attention

    p, rank, g = dist.get_world_size(), dist.get_rank(), torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, 16, 8, generator=g, dtype=torch.float64) for _ in range(3))
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    for kind, layout in (("ring", "zigzag"), ("ulysses", "contiguous")):
        mine = [cp.split_sequence(t, p, rank, layout).to(device()) for t in (q, k, v)]
        attend = cp.ring_attention if kind == "ring" else ulysses_attention
        out = attend(*mine, causal=True, **({"layout": layout} if kind == "ring" else {}))
        torch.testing.assert_close(out.cpu(), cp.split_sequence(whole, p, rank, layout), msg=kind)
    moe, x = ex.MixtureOfExperts(8, 16, 4, 2, seed=0), torch.randn(4 * p, 8, generator=g)
    n = len(x) // p
    want = moe(x[rank * n:(rank + 1) * n])[0].detach()  # before the experts move to the GPU
    got = ex.run_expert_parallel(moe, x, torch.ones(len(x), 8))
    torch.testing.assert_close(got["out"], want)
    return out, "ring (zigzag) and Ulysses attention = one process; experts over ranks"


CASES = [  # lesson, what, smallest world size, function
    ("00", "hello: one all-reduce", 1, _hello),
    ("03", "all-reduce four ways, timing", 1, _all_reduces),
    ("04", "data parallel by hand, DDP, hook", 1, _data_parallel),
    ("05", "pipeline (ours, torch's)", 1, _pipeline),
    ("05", "Megatron MLP, DTensor, FSDP2", 1, _tensor_parallel),
    ("02/06", "parameter server, gossip, local SGD", 2, _parameter_server_and_gossip),
    ("07", "compressed all-reduce, autocast", 1, _precision),
    ("08", "federated on ranks", 1, _federated),
    ("10", "overlap, profiler, compression, memory", 1, _fast_data_parallel),
    ("11", "ZeRO by hand, FSDP2, interleaved pipeline", 1, _memory_and_sharding),
    ("12", "train_gpt: data, tensor, pipeline, FSDP, context", 1, _choosing_a_strategy),
    ("13", "ring and Ulysses attention, experts", 1, _long_sequences_and_experts),
]
