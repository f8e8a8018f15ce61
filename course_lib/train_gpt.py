"""Train a small GPT under any plan: data x context x tensor x pipeline parallelism, ZeRO,
recomputation.

Lecture: the seed article's workflow ("choose a strategy, configure the environment, implement,
monitor"); lesson 12 runs here the plan :mod:`course_lib.planner` picks. Every part is an earlier
lesson's: tensor parallelism is Megatron's f and g (lesson 5, :mod:`course_lib.tensor_parallel`)
applied to attention (heads split) and the MLP (``tensor_parallel.ParallelBlock``); pipeline
parallelism is ``torch.distributed.pipelining``'s 1F1B (lessons 5 and 11); data parallelism
all-reduces the gradients after backward in one bucket (lesson 10,
``overlap.all_reduce_as_one_bucket``), or ZeRO-1/2 shards Adam (:mod:`course_lib.zero`), or
ZeRO-3 is FSDP2 (:mod:`course_lib.sharding`); context parallelism is lesson 13's ring attention
on the zigzag split in every block, its gradients averaged with the data-parallel ones over the
dp x cp ranks that hold the same layers. ``experts`` > 0 makes every block's MLP a mixture of
experts (:func:`course_lib.experts.with_experts`: nothing dropped, no balancing loss, so that
every plan computes what one process does), and expert parallelism (``ep``) spreads them over
ep consecutive data-parallel ranks, two all-to-alls per block (lesson 13). The plan is a
:class:`course_lib.plans.Plan`; :mod:`course_lib.plan_checks` refuses one it cannot run
exactly. ``--world-size`` may be left out: the plan's dp x cp x tp x pp is the number of ranks.

Ranks are laid out as the planner assumes: tensor-parallel innermost (as in Megatron-LM), then
context, then pipeline, then data parallel, so rank = ((d pp + s) cp + c) tp + t. ::

    python -m course_lib.train_gpt --dp 1 --tp 2 --pp 1          # two workers through launch
    torchrun --standalone --nproc-per-node 2 -m course_lib.train_gpt --tp 2
    python -m course_lib.train_gpt --cp 2                          # ring attention
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.collectives import subgroups
from course_lib.context_parallel import ring_attention, sequence_positions
from course_lib.data import stdlib_text, text_batch
from course_lib.experts import average_expert_gradients, model_of, spread_experts
from course_lib.memory import SavedBytes
from course_lib.models import tiny_gpt  # noqa: F401  (lesson 12b builds the GPT as T.tiny_gpt)
from course_lib.overlap import all_reduce_as_one_bucket
from course_lib.pipelining import StageModule, one_f_one_b
from course_lib.plan_checks import PLAN_FIELDS, check_model, check_plan, check_precision, check_run
from course_lib.runtime.devices import device
from course_lib.runtime.emulation import check_cpu_rank, queued, summary
from course_lib.runtime.timing import synchronize
from course_lib.sharding import fully_shard_blocks, local_bytes
from course_lib.tensor_parallel import causal_attention
from course_lib.zero import ShardedAdam, adam_state_bytes

MODEL = dict(vocab=96, d_model=64, layers=4, heads=4, context=32, experts=0, top_k=1)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def global_batch_of(tokens, step: int, global_batch: int, context: int, seed: int):
    """Step ``step``'s global batch: the same on every rank and in the one-process run."""
    generator = torch.Generator().manual_seed(seed * 100_003 + step)
    return text_batch(tokens, global_batch, context, generator)


def train(plan=None, steps: int = 10, global_batch: int = 16, lr: float = 3e-3, seed: int = 0,
          dtype=torch.float32, group=None, emulated=None, precision: str = "fp32",
          **options) -> dict:
    """Train :func:`course_lib.models.tiny_gpt` for ``steps`` Adam steps under ``plan`` (a
    :class:`course_lib.plans.Plan`, or its fields among ``options``: dp, tp, pp, cp, zero,
    micro_batches, recompute), on every rank. The other ``options`` are the model's shape:
    vocab, d_model, layers, heads, context, experts, top_k (defaults :data:`MODEL`).

    ``group`` must hold every rank of the job (a mesh makes new groups, which all ranks create
    together). Returns this rank's coordinates, the global mean ``losses`` (every rank has
    them), ``seconds`` per step and ``threads`` (its CPU threads), and the bytes it held:
    ``state`` (parameters, gradients, optimizer state) and ``activations`` (the peak saved for
    backward). ``emulated``: a ``runtime.emulation.EmulatedDevice`` whose queue computes each
    step (:meth:`~course_lib.runtime.emulation.EmulatedDevice.queued`; its ``emulated`` summary
    is returned, and ``waited``, the seconds of each step it waited for the host); None: this
    machine as it is. ``precision="bf16"``: bf16 mixed precision (``check_precision``; FSDP2
    with a bf16 ``MixedPrecisionPolicy``)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    fields = {k: options.pop(k) for k in PLAN_FIELDS if k in options}
    shape = {**MODEL, **options}
    check_run(steps, global_batch)
    check_model(shape)
    compute = check_precision(precision, dtype)
    world = dist.get_world_size(group)
    if world != dist.get_world_size():
        raise ValueError("train_gpt builds its own groups from the whole job: pass group=None "
                         "or a group of every rank")
    plan = check_plan(world, plan, global_batch=global_batch, layers=shape["layers"],
                      heads=shape["heads"], seq=shape["context"], experts=shape["experts"],
                      **fields)
    dp, tp, pp, cp, ep = plan.dp, plan.tp, plan.pp, plan.cp, plan.ep
    zero, micro_batches, recompute = plan.zero, plan.micro_batches, plan.recompute
    dev = device(group)
    if emulated is not None:
        check_cpu_rank(dev)
    ranks = torch.tensor(dist.get_process_group_ranks(group or dist.group.WORLD))
    grid = ranks.view(dp, pp, cp, tp)  # a cp dimension only if cp > 1: each group costs threads
    names = ("dp", "pp", "cp", "tp") if cp > 1 else ("dp", "pp", "tp")
    mesh = DeviceMesh(dev.type, grid if cp > 1 else grid.view(dp, pp, tp), mesh_dim_names=names)
    d, s, t = (mesh.get_local_rank(n) for n in ("dp", "pp", "tp"))
    dp_group, pp_group, tp_group = (mesh.get_group(n) for n in ("dp", "pp", "tp"))
    c, cp_group = (mesh.get_local_rank("cp"), mesh.get_group("cp")) if cp > 1 else (0, None)
    # gradients are averaged over the ranks that hold the same layers: dp x cp of them
    replicas = dp_group if cp == 1 else subgroups(grid.permute(1, 3, 0, 2).reshape(-1, dp * cp))
    positions, attend = None, causal_attention
    if cp > 1:  # this rank's share of each sequence, and attention over all of it
        positions = sequence_positions(shape["context"], cp, c, "zigzag")
        attend = partial(ring_attention, causal=True, layout="zigzag", group=cp_group)
    gpt = model_of(shape, seed, dtype)  # every plan starts from the same weights
    stage = StageModule(gpt, s, pp, t, tp, tp_group, recompute, positions, attend, compute).to(dev)
    spread, same_experts = [], None
    if ep > 1:  # ep consecutive data-parallel ranks share out the experts
        split = grid.view(dp // ep, ep, pp, cp, tp)
        ep_group = subgroups(split.permute(0, 2, 3, 4, 1).reshape(-1, ep))
        spread = spread_experts(stage.blocks, ep_group)
        same_experts = subgroups(split.permute(1, 2, 4, 0, 3).reshape(-1, dp // ep * cp))
    kept = {id(p) for p in spread}
    if zero == 3:
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
        shards = mesh["dp"] if cp == 1 else DeviceMesh.from_group(replicas, dev.type)
        policy = MixedPrecisionPolicy(compute, torch.float32) if compute else None
        stage = fully_shard_blocks(stage, shards, reshard_after_forward=True, mp_policy=policy)
    if zero in (1, 2):
        opt = ShardedAdam(stage.parameters(), zero, replicas, lr=lr)
    else:
        opt = torch.optim.Adam(stage.parameters(), lr=lr, foreach=False)
    runner = None
    if pp > 1:  # every shape given (the micro-batch's sequences, its tokens on this rank)
        runner = one_f_one_b(stage, s, pp, dev, pp_group, micro_batches, loss_fn, dtype,
                             (global_batch // (dp * micro_batches), shape["context"] // cp,
                              shape["d_model"], shape["vocab"]))
    tokens = stdlib_text()
    saved = SavedBytes()
    losses, seconds, peaks, waited = [], [], [], []
    rows = global_batch // dp
    for step in range(steps):
        x, y = global_batch_of(tokens, step, global_batch, shape["context"], seed)
        x, y = x[d * rows:(d + 1) * rows], y[d * rows:(d + 1) * rows]
        if positions is not None:
            x, y = x[:, positions], y[:, positions]
        x, y = x.to(dev), y.to(dev)
        synchronize(dev)
        start, lag = time.perf_counter(), emulated.lag if emulated else 0.0
        with queued(emulated):
            opt.zero_grad()
            saved.peak, micro = saved.now, []
            with saved.hooks():
                if runner is None:  # micro-batches are gradient accumulation
                    for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches),
                                      strict=True):
                        loss = loss_fn(stage(xm), ym)
                        (loss / micro_batches).backward()
                        micro.append(loss.detach())
                elif s == 0:
                    runner.step(x)
                else:
                    runner.step(target=y, losses=micro) if s == pp - 1 else runner.step()
            if zero == 0 and dp * cp > 1:  # one message of every gradient, after backward
                all_reduce_as_one_bucket([p for p in stage.parameters() if id(p) not in kept],
                                         replicas)
            if spread:  # the experts this rank holds: their own replicas
                average_expert_gradients(spread, ep, same_experts)
            opt.step()
        synchronize(dev)
        seconds.append(time.perf_counter() - start)
        waited.append((emulated.lag if emulated else 0.0) - lag)
        peaks.append(saved.peak)
        mean = torch.stack(micro).mean() if micro else torch.zeros((), dtype=dtype, device=dev)
        dist.all_reduce(mean, group=pp_group)  # only the last stage holds losses
        dist.all_reduce(mean, group=dp_group)
        if cp > 1:  # means over as many tokens on each cp rank
            dist.all_reduce(mean, group=cp_group)
        losses.append(mean.item() / (dp * cp))
    params = list(stage.parameters())
    state = dict(params=local_bytes(params), grads=local_bytes(p.grad for p in params),
                 optimizer=opt.state_bytes() if zero in (1, 2) else local_bytes(
                     v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)))
    return dict(rank=dist.get_rank(group), dp=d, pp=s, cp=c, tp=t, losses=losses, seconds=seconds,
                threads=torch.get_num_threads(), state=state, activations=peaks[-1], peaks=peaks,
                emulated=summary(emulated), waited=waited)


def train_one_process(steps: int = 10, global_batch: int = 16, lr: float = 3e-3, seed: int = 0,
                      dtype=torch.float32, recompute: bool = False, emulated=None,
                      precision: str = "fp32", **model) -> dict:
    """The baseline: the whole model, the whole global batch, Adam, in this process (on
    ``emulated``'s queue if given, as :func:`train`)."""
    shape = {**MODEL, **model}
    check_run(steps, global_batch)
    check_model(shape)
    compute = check_precision(precision, dtype)
    gpt = model_of(shape, seed, dtype)
    gpt.checkpointing = recompute
    opt = torch.optim.Adam(gpt.parameters(), lr=lr, foreach=False)
    tokens = stdlib_text()
    saved = SavedBytes()
    losses, seconds, waited = [], [], []
    for step in range(steps):
        x, y = global_batch_of(tokens, step, global_batch, shape["context"], seed)
        start, lag = time.perf_counter(), emulated.lag if emulated else 0.0
        with queued(emulated):
            opt.zero_grad()
            with saved.hooks():
                with torch.autocast(x.device.type, dtype=compute, enabled=compute is not None):
                    logits = gpt(x)
                loss = loss_fn(logits.to(dtype), y)
                loss.backward()
            opt.step()
        seconds.append(time.perf_counter() - start)
        waited.append((emulated.lag if emulated else 0.0) - lag)
        losses.append(loss.item())
    params = list(gpt.parameters())
    state = dict(params=local_bytes(params), grads=local_bytes(p.grad for p in params),
                 optimizer=adam_state_bytes(opt))
    return dict(losses=losses, seconds=seconds, threads=torch.get_num_threads(), state=state,
                activations=saved.peak, emulated=summary(emulated), waited=waited)


def main(argv=None) -> list | None:
    """The command line; returns every rank's results (``None`` on ranks other than torchrun's
    rank 0). ``--world-size``, if given, must be dp x tp x pp x cp (the plan decides)."""
    from course_lib.runtime.torchrun import (
        check_backend,
        experiment_parser,
        launched_by_torchrun,
        run_experiment,
    )

    parser = experiment_parser("Train a small GPT under a data x context x tensor x pipeline plan")
    parser.set_defaults(world_size=None)  # not given: dp x cp x tp x pp
    for name in ("dp", "tp", "pp", "cp", "ep"):
        parser.add_argument(f"--{name}", type=int, default=1)
    parser.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    parser.add_argument("--micro-batches", type=int, default=1)
    parser.add_argument("--recompute", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    for name, value in MODEL.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    a = parser.parse_args(argv)
    ranks = a.dp * a.tp * a.pp * a.cp
    names, sizes = ("dp x cp x tp x pp", f"{a.dp} x {a.cp} x {a.tp} x {a.pp}") if a.cp > 1 else (
        "dp x tp x pp", f"{a.dp} x {a.tp} x {a.pp}")
    if a.world_size not in (None, ranks):
        fix = (f"--world-size alone does not say how to split the ranks: give --dp, --tp, --pp "
               f"and --cp whose product is {a.world_size} (e.g. --dp {a.world_size})"
               if ranks == 1 and a.world_size > 1 else "make them agree, or leave it out")
        parser.error(f"--world-size {a.world_size}, but {names} = {sizes} = {ranks}; {fix}")
    if launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) != ranks:
        parser.error(f"torchrun started {os.environ['WORLD_SIZE']} processes, but {names} = "
                     f"{sizes} = {ranks}: start {ranks} (nodes x --nproc-per-node)")
    if not 0 < a.lr < float("inf"):
        parser.error(f"--lr must be positive and finite, got {a.lr}")
    check_backend(parser, a.backend, ranks)
    try:  # refused here, before any worker starts
        check_run(a.steps, a.global_batch)
        check_model({name: getattr(a, name) for name in MODEL})
        plan = check_plan(ranks, global_batch=a.global_batch, layers=a.layers, heads=a.heads,
                          seq=a.context, experts=a.experts,
                          **{name: getattr(a, name) for name in PLAN_FIELDS})
    except ValueError as why:
        parser.error(str(why))
    kwargs = dict(plan=plan, steps=a.steps, global_batch=a.global_batch, lr=a.lr,
                  precision=a.precision,
                  **{name: getattr(a, name) for name in MODEL})
    results = run_experiment(train, world_size=ranks, kwargs=kwargs, backend=a.backend,
                             timeout=a.timeout)
    if results is None:  # torchrun: rank 0 prints
        return None
    slowest = [max(r["seconds"][i] for r in results) for i in range(a.steps)]
    busiest = max(results, key=lambda r: sum(r["state"].values()) + r["activations"])
    print(f"plan: {plan}; {len(results)} ranks" + (", bf16" if a.precision == "bf16" else ""))
    print("loss per step: " + " ".join(f"{v:.4f}" for v in results[0]["losses"]))
    later = slowest[2:] or slowest
    threads = "/".join(map(str, sorted({r["threads"] for r in results})))  # the same on each
    print(f"median step of the slowest rank (after 2 warm-up steps): "
          f"{statistics.median(later) * 1e3:.1f} ms, {threads} CPU thread(s) per rank")
    print(f"most memory on one rank (rank {busiest['rank']}): state "
          f"{sum(busiest['state'].values()) / 2**20:.2f} MiB, activations "
          f"{busiest['activations'] / 2**20:.2f} MiB")
    return results


if __name__ == "__main__":
    from course_lib.runtime.torchrun import run_main

    run_main(main)
