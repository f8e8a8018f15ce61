"""Choosing a parallel strategy: every plan's memory and step time, the ones that fit, ranked.

Lecture: the seed article's workflow ("choose a strategy, configure, implement, monitor") and its
first trend, the automatic choice of a strategy; Narayanan et al. 2021 (Megatron-LM: data x
tensor x pipeline, interleaving); Korthikanti et al. 2022 (activation memory, selective
recomputation, sequence parallelism); Rajbhandari et al. 2020 (ZeRO). The model, the cluster and
the plan are :mod:`course_lib.plans`; a plan's memory is :mod:`course_lib.gpu_memory`, its time
:mod:`course_lib.step_time`; this module enumerates the plans and ranks them.

Ranks are laid out tensor-parallel innermost (as Megatron-LM does), then context, then pipeline,
then data parallel (Megatron-LM puts data parallel before pipeline; with tensor parallelism
filling a node the two orders give the same links), so a group of size g and stride k crosses
nodes when g k exceeds the GPUs of a node.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from course_lib.gpu_memory import (  # noqa: F401  (the planner's vocabulary, in one place)
    activation_bytes_per_layer,
    head_activation_bytes,
    in_flight,
    memory,
    state_bytes,
    tiny_gpt_bytes_per_layer,
)
from course_lib.plan_checks import check_model, check_plan, plan_conflicts
from course_lib.plans import (  # noqa: F401
    ATTENTION,
    GATHER_UNITS,
    Cluster,
    Plan,
    Transformer,
    check_positive,
)
from course_lib.stages import balanced_stages, micro_batch_size, stage_layers  # noqa: F401
from course_lib.step_time import TERMS, collectives, step_time  # noqa: F401


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def choices(name: str, values) -> list:
    """The choices a search option lists, each once, in order; a single value (a number, or a
    text that would be read letter by letter) is refused by name."""
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name} lists the choices to search, e.g. {name}=({values!r},), got "
                         f"{values!r}")
    return list(dict.fromkeys(values))


def candidate_plans(model: Transformer, cluster: Cluster, zero_stages=(0, 1, 2, 3),
                    micro_batch_sizes=(1, 2, 4, 8, 16, 32), recompute=(False, True),
                    attention=ATTENTION, sequence_parallel=(False, True),
                    chunks=(1, 2, 3, 4, 6, 8), gather_units=("block",), cp=(1,),
                    ep=(1,)) -> list[Plan]:
    """Every plan that uses all GPUs and has no conflict with the model
    (:func:`course_lib.plan_checks.plan_conflicts`: tp divides the heads, pp the layers, 1F1B's
    micro-batches, ZeRO-3 without pipelining, ...). The search: tp divides a node's GPUs (each
    tensor-parallel group inside one node); if pp does not divide the layers, the lighter stages
    sit at the ends (:func:`balanced_stages`); each data-parallel rank's share of the global
    batch splits into m micro-batches of one of ``micro_batch_sizes`` sequences (without
    pipelining, m is gradient accumulation); interleaving (``chunks`` v > 1) only with a
    pipeline, a ZeRO stage only with dp > 1, ``gather_units`` only for ZeRO-3, context
    parallelism over each of ``cp`` GPUs (1: none; the sequence splits evenly over them), expert
    parallelism over each of ``ep`` of the data-parallel GPUs (a model with ``experts``). The
    other arguments list the choices to search (each choice once; a repeated one counts once)."""
    n = cluster.gpus
    zero_stages, micro_batch_sizes, recompute, attention, sequence_parallel, chunks, \
        gather_units, cp, ep = (choices(name, values) for name, values in (
            ("zero_stages", zero_stages), ("micro_batch_sizes", micro_batch_sizes),
            ("recompute", recompute), ("attention", attention),
            ("sequence_parallel", sequence_parallel), ("chunks", chunks),
            ("gather_units", gather_units), ("cp", cp), ("ep", ep)))
    for name, given, known in (("zero_stages", zero_stages, (0, 1, 2, 3)),
                               ("attention", attention, ATTENTION),
                               ("gather_units", gather_units, GATHER_UNITS)):
        if unknown := [x for x in given if x not in known or isinstance(x, bool)]:
            raise ValueError(f"candidate_plans: {name} takes {known}, got {unknown}")
    for b in micro_batch_sizes:
        check_positive("candidate_plans", micro_batch_sizes=b)
    for c in cp:
        check_positive("candidate_plans", cp=c)
    for e in ep:
        check_positive("candidate_plans", ep=e)
    rules = dict(layers=model.layers, heads=model.heads, global_batch=model.global_batch,
                 kv_heads=model.kv_heads, seq=model.seq, experts=model.experts)
    plans = []
    for tp, c, pp in itertools.product(divisors(n), sorted(set(cp)), divisors(n)):
        if cluster.gpus_per_node % tp or n % (tp * c * pp):
            continue
        dp = n // (tp * c * pp)
        uneven = model.layers % pp and pp <= model.layers
        stages = balanced_stages(model.layers, pp) if uneven else None
        if plan_conflicts(Plan(dp, tp, pp, micro_batches=pp, stages=stages, cp=c),
                          **(rules | dict(global_batch=dp * pp))):
            continue  # tp or pp cannot split this model, whatever the other choices
        for zero, b, full, attn, sp, v, e in itertools.product(
                zero_stages, micro_batch_sizes, recompute, attention, sequence_parallel,
                chunks, sorted(set(ep))):
            m, left = divmod(model.global_batch, dp * b)
            if left or (zero and dp * c == 1) or (v > 1 and pp == 1):
                continue
            for unit in gather_units if zero == 3 else ("block",):
                plan = Plan(dp, tp, pp, zero, m, full, attn, sp, v, stages, unit, c, e)
                if not plan_conflicts(plan, **rules):
                    plans.append(plan)
    return plans


@dataclass
class Ranked:
    plan: Plan
    memory: dict
    time: dict
    fits: bool
    collectives: int = 0
    micro_batch: float = 0.0  # sequences per micro-batch
    notes: list = field(default_factory=list)


def one_gpu_seconds(model: Transformer, cluster: Cluster, plan: Plan) -> float:
    """One GPU doing the whole step (if the model fit): the plan's hardware FLOPs at the
    cluster's kernel speed, nothing else."""
    return model.hardware_flops(plan.recompute, plan.attention) / cluster.speed


def rank_plans(model: Transformer, cluster: Cluster, per_layer=activation_bytes_per_layer,
               per_head=head_activation_bytes, overlap: bool = True, **options) -> list[Ranked]:
    """All candidate plans (``options`` go to :func:`candidate_plans`) with their predictions:
    the ones that fit first, fastest first (to three significant figures); of equally fast ones
    the one with fewer collectives, then larger micro-batches, then less memory. A plan slower
    than one GPU, or than plain data parallelism where that fits, says so in ``notes``.
    ``per_layer``, ``per_head`` and ``overlap`` as in :func:`memory` and :func:`step_time`."""
    plans = candidate_plans(model, cluster, **options)
    if not plans:
        raise ValueError(
            f"no plan uses all {cluster.gpus} GPUs for this model: tp must divide the heads "
            f"({model.heads}) and a node's {cluster.gpus_per_node} GPUs, pp be at most the "
            f"layers ({model.layers}), dp divide the global batch ({model.global_batch}), 2 x cp "
            f"the sequence ({model.seq}), ep the experts ({model.experts}) and dp, and the "
            f"choices given ({sorted(options) or 'none'}) "
            f"leave some plan")
    out = []
    for plan in plans:
        mem = memory(model, plan, per_layer, per_head)
        out.append(Ranked(plan, mem, step_time(model, cluster, plan, overlap),
                          mem["total"] <= cluster.memory, collectives(model, plan),
                          micro_batch_size(model, plan)))
    out.sort(key=rank_key)
    plain = {r.plan.recomputation: r for r in reversed(out)
             if r.fits and r.plan.tp == r.plan.pp == r.plan.cp == 1 and r.plan.zero == 0}
    for r in out:
        single = one_gpu_seconds(model, cluster, r.plan)
        if r.time["total"] > single:
            r.notes.append(f"slower than one GPU would be ({single:.3g} s), if the model fit")
        data = plain.get(r.plan.recomputation)
        if data is not None and r.plan.tp * r.plan.pp * r.plan.cp > 1 and \
                r.time["total"] > data.time["total"]:
            r.notes.append(f"slower than plain data parallelism, which fits ({data.plan}: "
                           f"{data.time['total']:.3g} s)")
    return out


def to_three_figures(seconds: float) -> float:
    """Step times the ranking calls equal: the same to three significant figures."""
    return float(f"{seconds:.3g}")


def size(n_bytes: float) -> str:
    """Bytes in GiB, or MiB below one GiB (a small model's plans differ below 0.1 GiB)."""
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.2f} MiB"


def rank_key(r: Ranked) -> tuple:
    """How plans are ranked: those that fit first, then the step time to three figures; ties go
    to fewer collectives a step, then larger micro-batches, then less memory per GPU."""
    return (not r.fits, to_three_figures(r.time["total"]), r.collectives, -r.micro_batch,
            r.memory["total"])


def why(best: Ranked, other: Ranked) -> str:
    """Why ``other`` ranks below ``best``: it does not fit, the tie-break, or the term that
    costs it most."""
    for name, ranked in (("best", best), ("other", other)):
        if not isinstance(ranked, Ranked):
            raise TypeError(f"why() compares two of rank_plans' results; {name} is a "
                            f"{type(ranked).__name__}: rank it with rank_plans first")
    if other is best:
        return f"{other.plan}: the best plan itself"
    if other.fits and rank_key(other) < rank_key(best):
        raise ValueError(f"why(best, other): {other.plan} ranks above {best.plan}; give the "
                         f"better plan first")
    if not other.fits:
        return (f"{other.plan}: needs {size(other.memory['total'])} per GPU "
                f"({size(other.memory['state'])} state, "
                f"{size(other.memory['activations'])} activations)")
    if to_three_figures(other.time["total"]) == to_three_figures(best.time["total"]):
        if other.collectives != best.collectives:
            tie = f"{other.collectives} collectives a step against {best.collectives}"
        elif other.micro_batch != best.micro_batch:
            tie = (f"micro-batches of {other.micro_batch:g} sequences against "
                   f"{best.micro_batch:g}")
        elif other.memory["total"] != best.memory["total"]:
            tie = (f"{size(other.memory['total'])} per GPU against "
                   f"{size(best.memory['total'])}")
        else:
            tie = "equal on every count the ranking uses: the first listed ranks first"
        return f"{other.plan}: as fast as the best (to three figures), but {tie}"
    worst = max(TERMS, key=lambda k: other.time[k] - best.time[k])
    extra = other.time[worst] - best.time[worst]
    return (f"{other.plan}: {other.time['total'] / best.time['total']:.2f} x the best step, most "
            f"of it {worst.replace('_', ' ')} (+{extra * 1e3:.0f} ms)")


def torchrun_command(model: Transformer, cluster: Cluster, plan: Plan, steps: int = 10) -> str:
    """The command that runs ``plan`` with :mod:`course_lib.train_gpt` on every node of
    ``cluster``. One node: ``--standalone`` (torchrun picks a free port). Several: the same
    command on each node, with the rendezvous host and a free port of your choosing in
    $HEAD_NODE and $PORT (a fixed port collides with other jobs) and a name for this job, the
    same on every node, in $JOB_ID (the rendezvous joins only the nodes that give it).
    train_gpt runs data, context, tensor, pipeline and expert parallelism, ZeRO and full
    recomputation, in bf16 mixed precision for a model of 2-byte values;
    its attention is PyTorch's ``scaled_dot_product_attention`` (ring attention with cp > 1)
    whatever the plan's ``attention`` says. A plan it cannot run exactly (sequence parallelism,
    interleaving, uneven stages, selective recomputation, ...) is refused
    (:func:`course_lib.plan_checks.check_plan`), and so is a model other than the one it runs
    (its GPT: an untied head, learned positions, no dropout, a plain MLP 4 x d wide)."""
    # what train_gpt's command line would refuse, or run as another model, refused here
    check_positive("torchrun_command", steps=steps)
    if model.shared_experts:
        raise ValueError("train_gpt's mixtures of experts have no shared experts: plan a model "
                         "with shared_experts=0 to run it")
    if model.gated_mlp or model.kv_width != model.hidden or model.ffn_width != 4 * model.hidden:
        raise ValueError("train_gpt's GPT has a plain MLP 4 x d_model wide and a key/value head "
                         "per head: plan a model with gated_mlp=False, ffn=None, kv_heads=None "
                         "to run it")
    if model.tied_head or model.dropout or not model.learned_positions:
        raise ValueError("train_gpt's GPT has a head of its own, learned positions and no "
                         "dropout: plan replace(model, tied_head=False, dropout=False, "
                         "learned_positions=True) to run it")
    check_model(dict(vocab=model.vocab, d_model=model.hidden, layers=model.layers,
                     heads=model.heads, context=model.seq, experts=model.experts,
                     top_k=model.top_k))
    check_plan(cluster.gpus, plan, global_batch=model.global_batch, layers=model.layers,
               heads=model.heads, seq=model.seq, experts=model.experts)
    where = ("--standalone" if cluster.nodes == 1 else
             f"--nnodes {cluster.nodes} --rdzv-backend c10d --rdzv-endpoint $HEAD_NODE:$PORT "
             f"--rdzv-id $JOB_ID")
    flags = (f"--dp {plan.dp} --tp {plan.tp} --pp {plan.pp}"
             f"{f' --cp {plan.cp}' if plan.cp > 1 else ''}"
             f"{f' --ep {plan.ep}' if plan.ep > 1 else ''} --zero {plan.zero} "
             f"--micro-batches {plan.micro_batches}{' --recompute' if plan.recompute else ''}"
             f"{' --precision bf16' if model.value_bytes == 2 else ''}")
    shape = (f"--layers {model.layers} --d-model {model.hidden} --heads {model.heads} "
             f"--context {model.seq} --vocab {model.vocab} --global-batch {model.global_batch}"
             + (f" --experts {model.experts} --top-k {model.top_k}" if model.experts else ""))
    return (f"torchrun {where} --nproc-per-node {cluster.gpus_per_node} -m course_lib.train_gpt "
            f"{flags} {shape} --steps {steps}")


def same_choices(plan: Plan, **known) -> bool:
    """Whether ``plan`` has every field ``known`` gives (the rest are free)."""
    if unknown := sorted(set(known) - set(plan.as_dict())):
        raise ValueError(f"a Plan has no field {', '.join(unknown)}: its fields are "
                         f"{', '.join(plan.as_dict())}")
    return all(getattr(plan, name) == value for name, value in known.items())


def with_plan(ranked: list[Ranked], **known) -> list[Ranked]:
    """The ranked plans that match ``known`` fields, in rank order."""
    if known.get("stages") is not None:  # a list or an array of layers, as Plan keeps a tuple
        known["stages"] = tuple(int(n) for n in known["stages"])
    return [r for r in ranked if same_choices(r.plan, **known)]


def fitting(ranked: list[Ranked]) -> list[Ranked]:
    """The ranked plans that fit in memory, best first; where none does, an error naming the
    smallest plan and the memory it needs on a GPU."""
    if not ranked:
        raise ValueError("no plans to choose from: rank them with rank_plans first")
    fits = [r for r in ranked if r.fits]
    if not fits:
        least = min(ranked, key=lambda r: r.memory["total"])
        raise ValueError(f"none of the {len(ranked)} plans fits: the smallest, {least.plan}, "
                         f"needs {size(least.memory['total'])} on a GPU. Try more GPUs or GPUs "
                         f"with more memory")
    return fits
