"""Benchmark for lesson 10: does overlapping the all-reduce with backward make a step faster?

DDP paper (Li et al., VLDB 2020), section 3.2. Prints, asserts nothing:

    python -m course_lib.benchmarks.overlap [--steps 15] [--emulated]  # or under torchrun

On two ranks (one thread each), lesson 10's small GPT on the standard library's source: each
synchronisation's median step, (a) after backward, (b) per parameter, (c) buckets, DDP, the bucket
sweep, and their ratios to (a); the share of communication hidden under backward, measured from
a ``torch.profiler`` trace, next to the alpha-beta model's.
"""

from __future__ import annotations

import copy
import functools
import statistics
import time

import torch
import torch.distributed as dist

from course_lib import cost_models
from course_lib import overlap as ov
from course_lib.benchmarks.systems import reference_system
from course_lib.data import stdlib_text, text_batch
from course_lib.models import tiny_gpt
from course_lib.runtime import profiling
from course_lib.runtime.devices import device
from course_lib.runtime.emulation import (
    EmulatedDevice,
    catch_up,
    check_cpu_rank,
    flops_of,
    paced_step,
    rate_for,
    reachable_ratio,
)
from course_lib.runtime.timing import synchronize
from course_lib.runtime.torchrun import check_backend, experiment_parser, positive, run_experiment
from course_lib.training import check_whole

MAIN = (("after backward", None), ("per parameter", None), ("buckets", 1.0), ("DDP", 1.0))
SWEEP_MB = (0.05, 0.15, 0.5, 1.0, 2.0, 4.0)  # 4 MB: one bucket for the 3.3 MB model
MESSAGE_BYTES = (2**10, 2**14, 2**17, 2**19, 2**21, 2**22)
model_fn = functools.partial(tiny_gpt, vocab=96, d_model=128, layers=4, heads=4, context=64)
# emulated: a wider, deeper GPT, 8 characters per rank: more gradient bytes per FLOP (a system's
# ratio reachable with idle cores) and more tensors (alpha paid as often as in a real model)
EMULATED = dict(model=functools.partial(tiny_gpt, vocab=96, d_model=192, layers=6, heads=4,
                                        context=8), local_batch=1, context=8)


def label(config) -> str:
    sync, mb = config
    return sync if mb is None else f"{sync} {mb:g} MB"


def one_step(model, wait, x, y, lr=None, dev=None, emulated=None):
    """One data-parallel step in profiler phases: forward, backward, ``wait`` (the
    synchroniser), and with ``lr`` an SGD step; with ``dev`` it waits for the device after.
    ``emulated``: the compute takes an emulated device's time (its gradients must be paced:
    ``emulated.pace_gradients(model)``; its first step counts the FLOPs)."""
    with paced_step(emulated):
        with profiling.phase("forward"):
            loss = ov.loss_fn(model, x, y)
            catch_up(emulated)
        with profiling.phase("backward"):
            loss.backward()
            catch_up(emulated)
        with profiling.phase("wait"):
            wait()
            catch_up(emulated)
        if lr is not None:
            with profiling.phase("optimizer"), torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= lr * p.grad
                catch_up(emulated)
    if dev is not None:
        synchronize(dev)


def _gradient_ready_times(model, x, y, emulated=None):
    """Seconds after backward starts at which each parameter's gradient is written (no
    communication), and how long backward takes (on the ``emulated`` device when given)."""
    ready = {}
    params = [p for p in model.parameters() if p.requires_grad]
    handles = [p.register_post_accumulate_grad_hook(
        lambda p, i=i: ready.__setitem__(i, time.perf_counter())) for i, p in enumerate(params)]
    with paced_step(emulated):
        loss = ov.loss_fn(model, x, y)
        catch_up(emulated)
        start = time.perf_counter()
        loss.backward()
        catch_up(emulated)
        end = time.perf_counter()
    for h in handles:
        h.remove()
    return [ready[i] - start for i in range(len(params))], end - start


def message_times(sizes, repeats, group, dev, before=None):
    """{bytes: seconds of each all-reduce that size}: messages of ``sizes`` bytes back to back,
    after ``before()`` (a step's compute) and a barrier, timed as a step sends them."""
    bufs = {n: torch.zeros(n // 4, device=dev) for n in set(sizes)}
    out = {n: [] for n in bufs}
    for i in range(repeats + 1):  # the first is a warm-up
        if before is not None:
            before()
        dist.barrier(group=group)
        for n in sizes:
            start = time.perf_counter()
            dist.all_reduce(bufs[n], group=group)
            synchronize(dev)
            if i:
                out[n].append(time.perf_counter() - start)
    return out


def bucket_copy_seconds(grads) -> float:
    """Seconds for the host to pack ``grads`` into one bucket for two ranks and unpack it (work
    without FLOPs: an emulated device leaves it to the host, and a bucket's message waits)."""
    start = time.perf_counter()
    ov.unpack_bucket(ov.pack_bucket(grads, 2), grads)
    return time.perf_counter() - start


def calibrate(model, x, y, group, dev, repeats: int = 5) -> dict:
    """This machine's side of the similarity: a step's FLOPs, its forward and backward's thread
    CPU time (what the device models) and an all-reduce of all gradients, medians, worst rank."""
    flops, _ = flops_of(one_step, model, lambda: None, x, y, 1e-3)
    cpu, comm = [], []
    grads = torch.zeros(sum(p.numel() for p in model.parameters()), device=dev)
    for i in range(repeats + 1):  # the first is a warm-up
        start = time.thread_time()
        ov.loss_fn(model, x, y).backward()  # what the device models; the SGD update is not
        spent = time.thread_time() - start
        dist.barrier(group=group)
        wall = time.perf_counter()
        dist.all_reduce(grads, group=group)
        if i:
            cpu.append(spent)
            comm.append(time.perf_counter() - wall)
    worst = torch.tensor([statistics.median(cpu), statistics.median(comm)], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return dict(flops=flops, compute_cpu=worst[0].item(), communication=worst[1].item())


def run(configs=MAIN + tuple(("buckets", mb) for mb in SWEEP_MB if mb != 1.0),
        local_batch: int = 2, steps: int = 15, warmup: int = 3, repeats: int = 7,
        seed: int = 0, group=None, model=None, context: int = 64, ratio: float | None = None,
        stands_for: str = "", profiled=True, message_repeats: int | None = None) -> dict:
    """On every rank: per-step seconds of each synchronisation in ``configs`` and of a step without
    communication ("none"), alternating step by step; one profiled step of each (``profiled``:
    True all, False none, or a collection of labels); gradient ready times and sizes; all-reduce
    times of each gradient, ``MESSAGE_BYTES`` and all gradients as one message, for alpha and
    beta (``message_repeats`` streams, default ``repeats``). ``model``: its constructor, trained on
    ``local_batch`` windows of ``context`` characters per rank. ``ratio``: on an emulated device
    whose compute makes the whole gradient's all-reduce take ``ratio`` x a step's compute
    (``stands_for``: the system; a CPU too slow runs the largest it can, ``achieved``); None: this
    CPU as it is. ``copy_per_byte``: the host's seconds per byte to pack and unpack a bucket."""
    for name, value in dict(steps=steps, repeats=repeats, local_batch=local_batch).items():
        check_whole(name, value)
    check_whole("warmup" + " (an emulated device's first step counts FLOPs, unpaced)"
                * (ratio is not None), warmup, least=int(ratio is not None))
    rank, dev = dist.get_rank(group), device(group)
    model = model or model_fn
    tokens = stdlib_text()
    g = torch.Generator().manual_seed(seed * 1000 + rank)  # each rank its own data

    def batch():
        return (t.to(dev) for t in text_batch(tokens, local_batch, context, g))

    configs = [("none", None), *configs]
    first = model().to(dev)  # every config starts from these weights (a copy: building is slow)
    models = {config: ov.synchronizer(copy.deepcopy(first), config[0], config[1] or 25.0, group)
              for config in configs}
    plain = models[("none", None)][0]
    emulated, similarity, used = None, {}, None
    if ratio is not None:
        check_cpu_rank(dev)
        similarity = calibrate(plain, *batch(), group, dev)
        used = reachable_ratio(ratio, similarity["communication"], similarity["compute_cpu"])
        emulated = EmulatedDevice(rate_for(used, **similarity), stands_for)
        for inner, _ in models.values():
            emulated.pace_gradients(inner, carry=True)  # backward: one run, as on a device
    times = {label(c): [] for c in configs}
    grads = [torch.ones_like(p) for p in plain.parameters()]
    copies = []  # the host's bucket copies of all gradients, timed beside the steps
    for step in range(warmup + steps):
        for config in configs:
            x, y = batch()
            dist.barrier(group=group)
            start = time.perf_counter()
            one_step(*models[config], x, y, 1e-3, dev, emulated)
            if step >= warmup:
                times[label(config)].append(time.perf_counter() - start)
        copied = bucket_copy_seconds(grads)
        if step >= warmup:
            copies.append(copied)
    # how the device kept to its model in the timed steps (the profiler's own work comes after)
    kept = {k: emulated and getattr(emulated, k) for k in ("lag", "unmodelled", "device_seconds")}
    profiles = {}
    chosen = [c for c in configs if profiled is True or (profiled and label(c) in profiled)]
    for config in chosen:
        x, y = batch()
        dist.barrier(group=group)
        prof, _ = profiling.profile(
            lambda c=config, x=x, y=y: one_step(*models[c], x, y, 1e-3, dev, emulated))
        profiles[label(config)] = profiling.step_spans(prof, lane=rank)
    ready, backward = _gradient_ready_times(plain, *batch(), emulated)
    sizes = [p.numel() * p.element_size() for p in plain.parameters()]
    messages = message_times(sizes[::-1] + list(MESSAGE_BYTES) + [sum(sizes)],
                             message_repeats or repeats, group, dev,
                             lambda: one_step(plain, lambda: None, *batch(), dev=dev,
                                              emulated=emulated))
    return dict(times=times, spans=profiles, ready=ready, backward=backward, sizes=sizes,
                messages=messages, ratio=ratio, achieved=used,
                copy_per_byte=statistics.median(copies) / sum(sizes),
                flops_per_second=emulated and emulated.flops_per_second, **similarity, **kept)


def summarise(runs) -> dict:
    """Combine the ranks' results: medians of the slowest rank per step, both ranks' spans,
    alpha and beta fitted to the all-reduce times, and the model's hidden fraction of each
    synchronisation next to the measured one (rank 0's)."""
    times = {k: [max(ts) for ts in zip(*(r["times"][k] for r in runs), strict=True)]
             for k in runs[0]["times"]}
    sizes = sorted(runs[0]["messages"])
    sent = {n: [max(ts) for ts in zip(*(r["messages"][n] for r in runs), strict=True)]
            for n in sizes}  # each message as the slower rank saw it
    # least squares in seconds over every message, not a fit to each size's median: a few
    # messages in a stream take ten times the median, and a step pays for them too
    alpha, beta = cost_models.fit_alpha_beta([n for n in sizes for _ in sent[n]],
                                             [t for n in sizes for t in sent[n]], relative=False)
    seconds = [statistics.mean(sent[n]) for n in sizes]
    ready, n_bytes, backward = runs[0]["ready"], runs[0]["sizes"], runs[0]["backward"]
    predicted, measured = {}, {}
    for name in times:
        if name == "none" or name.startswith("after"):
            continue
        mb = None if name == "per parameter" else float(name.split()[-2])
        msgs = ([(t, [n]) for t, n in zip(ready, n_bytes, strict=True)] if mb is None else
                [(max(ready[i] for i in b), [n_bytes[i] for i in b])
                 for b in ov.assign_buckets([torch.empty(n // 4) for n in n_bytes], mb)])
        predicted[name] = cost_models.hidden_fraction_model(
            [t for t, _ in msgs], [sum(ns) for _, ns in msgs], alpha, beta, backward)
        if name in runs[0]["spans"]:
            measured[name] = profiling.hidden_fraction(runs[0]["spans"][name], lane=0)
    spans = {k: [s for r in runs for s in r["spans"][k]] for k in runs[0]["spans"]}
    emulated = None
    if runs[0]["ratio"] is not None:  # as shares of the device's time, the worst rank's
        emulated = {k: runs[0][k] for k in ("ratio", "achieved", "flops_per_second", "flops",
                                            "compute_cpu", "communication")}
        emulated["lag"] = max(r["lag"] / r["device_seconds"] for r in runs)
        emulated["unmodelled"] = max(r["unmodelled"] / r["device_seconds"] for r in runs)
    return dict(times=times, medians={k: statistics.median(v) for k, v in times.items()},
                emulated=emulated, spans=spans, alpha=alpha, beta=beta, message_sizes=sizes,
                copy_per_byte=max(r["copy_per_byte"] for r in runs),
                message_seconds=seconds, predicted=predicted, measured=measured,
                ready=ready, gradient_bytes=n_bytes, backward=backward)


def main(argv=None):
    parser = experiment_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive(int), default=15)
    parser.add_argument("--emulated", action="store_true",
                        help="on an emulated device, reference_system()'s ratio or less")
    args = parser.parse_args(argv)
    if args.world_size != 2 or (args.emulated and args.backend == "nccl"):
        parser.error("the overlap benchmark runs on two ranks, and --emulated on CPU ranks (gloo)")
    check_backend(parser, args.backend, args.world_size)
    kwargs = dict(steps=args.steps)
    if args.emulated:
        system = reference_system()
        kwargs |= EMULATED | dict(ratio=system["ratio"], stands_for=system["name"])
    runs = run_experiment(run, world_size=args.world_size, kwargs=kwargs, timeout=args.timeout,
                          backend="gloo" if args.emulated else args.backend)
    if runs is None:  # torchrun: rank 0 prints
        return None
    s = summarise(runs)
    med = s["medians"]
    if s["emulated"]:
        print(f"emulated device (not a GPU measurement): communication / compute = "
              f"{s['emulated']['achieved']:.3f} ({system['name']}: {s['emulated']['ratio']:.3f}); "
              f"late by {s['emulated']['lag']:.1%} of its time")
    print(f"alpha {s['alpha'] * 1e6:.0f} us, beta {1 / s['beta'] / 1e9:.2f} GB/s (fitted); "
          f"gradients {sum(s['gradient_bytes']) / 1e6:.2f} MB")
    print("(a): the step with one all-reduce after backward")
    for name, t in med.items():
        extra = (f"; hidden under backward: measured {s['measured'][name]:.0%}, model "
                 f"{s['predicted'][name]:.0%}") if name in s["measured"] else ""
        print(f"  {name:22s} {t * 1e3:6.1f} ms  ({t / med['after backward']:.2f} x (a)){extra}")
    best = min(med[k] for k in med if k != "none" and not k.startswith("after"))
    print(f"best overlapped step / (a): {best / med['after backward']:.2f} (target <= 0.8)")
    return s


if __name__ == "__main__":
    main()
