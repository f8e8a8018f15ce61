"""Choosing a parallel strategy: predict each plan's memory and step time, rank the ones that fit.

Lecture: the seed article's workflow ("choose a strategy, configure, implement, monitor") and its
first trend, the automatic choice of a strategy; Narayanan et al. 2021 (Megatron-LM: data x tensor
x pipeline); Korthikanti et al. 2022 (activation memory); Rajbhandari et al. 2020 (ZeRO). Every
term is a formula of the earlier lessons, on one vocabulary:

* memory per GPU: training state ``cost_models.zero_bytes_per_rank`` of the GPU's share of the
  parameters, plus activations (Korthikanti et al., without sequence parallelism; with full
  recomputation only each layer's input) for the micro-batches a 1F1B stage keeps in flight;
* step time: compute at an assumed model FLOPs utilisation, the pipeline bubble (p - 1)/m of it,
  tensor parallelism's all-reduces (not overlapped), pipeline sends, and the data-parallel
  gradient all-reduce less what backward hides (lesson 10).

Ranks are laid out tensor-parallel innermost, then pipeline, then data parallel (Megatron's
order), so a group of size g and stride k crosses nodes when g k exceeds the GPUs of a node.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from course_lib.cost_models import ring_all_reduce_time, zero_bytes_per_rank


@dataclass(frozen=True)
class Transformer:
    """A GPT-style model: ``layers`` blocks of width ``hidden`` with ``heads`` heads, sequences of
    ``seq`` tokens, a vocabulary of ``vocab``, ``global_batch`` sequences per step."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    global_batch: int

    @property
    def parameters(self) -> int:
        """12 h^2 + 13 h per block (attention 4 h^2 + 4 h, MLP 8 h^2 + 5 h, two LayerNorms 4 h),
        plus token and position embeddings (the head shares the token embedding)."""
        h = self.hidden
        return self.layers * (12 * h * h + 13 * h) + (self.vocab + self.seq) * h

    def flops_per_step(self, recompute: bool = False) -> float:
        """6 parameters x tokens for forward and backward (8 with recomputation: one more forward),
        plus attention's scores: 12 layers h s^2 per sequence (16 with recomputation)."""
        tokens = self.global_batch * self.seq
        factor = 8 if recompute else 6
        attention = 2 * factor * self.layers * self.hidden * self.seq ** 2 * self.global_batch
        return factor * self.parameters * tokens + attention


@dataclass(frozen=True)
class Cluster:
    """GPUs: ``gpus_per_node`` on each of ``nodes``; ``memory`` bytes and ``peak_flops`` each;
    links inside a node (``intra_*``) and between nodes (``inter_*``): bandwidth in bytes/s,
    latency in seconds. ``mfu``: the share of peak a well-tuned step reaches."""

    gpus_per_node: int
    nodes: int
    memory: float
    peak_flops: float
    intra_bandwidth: float
    inter_bandwidth: float
    intra_latency: float = 5e-6
    inter_latency: float = 10e-6
    mfu: float = 0.5

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def link(self, size: int, stride: int) -> tuple[float, float]:
        """(alpha, beta) of a group of ``size`` ranks ``stride`` apart."""
        if size * stride > self.gpus_per_node:
            return self.inter_latency, 1 / self.inter_bandwidth
        return self.intra_latency, 1 / self.intra_bandwidth


@dataclass(frozen=True)
class Plan:
    """Data-parallel ``dp``, tensor-parallel ``tp`` and pipeline ``pp`` degrees, ZeRO ``zero``
    stage over the data-parallel ranks, ``micro_batches`` per step, full ``recompute``."""

    dp: int
    tp: int
    pp: int
    zero: int = 0
    micro_batches: int = 1
    recompute: bool = False

    def __str__(self):
        return (f"dp {self.dp} x tp {self.tp} x pp {self.pp}, ZeRO-{self.zero}, "
                f"m {self.micro_batches}{', recompute' if self.recompute else ''}")


BYTES = 2  # bf16 activations, gradients and messages


def micro_batch_size(model: Transformer, plan: Plan) -> float:
    """Sequences per micro-batch on one data-parallel rank."""
    return model.global_batch / (plan.dp * plan.micro_batches)


def activation_bytes_per_layer(model: Transformer, plan: Plan) -> float:
    """One layer's activations for one micro-batch on one GPU (Korthikanti et al. 2022, no
    sequence parallelism): s b h (10 + 24/t + 5 a s / (h t)) bytes; with recomputation only the
    layer's input, 2 s b h."""
    s, h, a, t = model.seq, model.hidden, model.heads, plan.tp
    b = micro_batch_size(model, plan)
    if plan.recompute:
        return BYTES * s * b * h
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def memory(model: Transformer, plan: Plan) -> dict:
    """Predicted bytes per GPU: ``state`` (parameters, gradients, optimizer: 16 bytes a parameter
    of this GPU's share, divided by ZeRO over dp) and ``activations`` (the first pipeline stage
    keeps min(pp, m) micro-batches in flight under 1F1B), and their ``total``."""
    share = model.parameters / (plan.tp * plan.pp)
    state = zero_bytes_per_rank(share, plan.dp, plan.zero)
    in_flight = min(plan.pp, plan.micro_batches)
    acts = model.layers / plan.pp * in_flight * activation_bytes_per_layer(model, plan)
    return dict(state=state, activations=acts, total=state + acts)


def step_time(model: Transformer, cluster: Cluster, plan: Plan) -> dict:
    """Predicted seconds of one step, term by term, and their ``total``."""
    compute = model.flops_per_step(plan.recompute) / (cluster.gpus * cluster.peak_flops
                                                       * cluster.mfu)
    bubble = compute * (plan.pp - 1) / plan.micro_batches
    b = micro_batch_size(model, plan)
    activation = BYTES * model.seq * b * model.hidden
    tp = 0.0
    if plan.tp > 1:  # 2 all-reduces forward, 2 backward, per layer and micro-batch
        alpha, beta = cluster.link(plan.tp, 1)
        per = float(ring_all_reduce_time(activation, plan.tp, alpha, beta))
        tp = 4 * model.layers / plan.pp * plan.micro_batches * per
    pp = 0.0
    if plan.pp > 1:  # a send forward and one backward per micro-batch, on the critical path
        alpha, beta = cluster.link(plan.pp, plan.tp)
        pp = 2 * (plan.micro_batches + plan.pp - 1) * (alpha + beta * activation)
    dp = 0.0
    if plan.dp > 1:  # the gradients of this GPU's share; ZeRO-3 gathers parameters once more
        alpha, beta = cluster.link(plan.dp, plan.tp * plan.pp)
        grads = BYTES * model.parameters / (plan.tp * plan.pp)
        total = float(ring_all_reduce_time(grads, plan.dp, alpha, beta))
        total *= 1.5 if plan.zero == 3 else 1.0
        dp = max(0.0, total - 2 / 3 * compute)  # backward (2/3 of compute) hides the rest
    out = dict(compute=compute, bubble=bubble, tensor_parallel=tp, pipeline=pp,
               data_parallel=dp)
    out["total"] = sum(out.values())
    return out


def candidate_plans(model: Transformer, cluster: Cluster, zero_stages=(0, 1, 2, 3),
                    micro_batches=(1, 2, 4, 8, 16, 32)) -> list[Plan]:
    """Every plan that uses all GPUs: tp divides the heads and stays within a node, pp divides
    the layers, the global batch splits into dp x m micro-batches (without pipelining, m is
    gradient accumulation); ZeRO-3 without pipelining."""
    n = cluster.gpus
    plans = []
    for tp, pp in itertools.product(range(1, n + 1), repeat=2):
        if n % (tp * pp) or model.heads % tp or model.layers % pp or tp > cluster.gpus_per_node:
            continue
        dp = n // (tp * pp)
        for zero, m, recompute in itertools.product(zero_stages, micro_batches, (False, True)):
            if model.global_batch % (dp * m) or (zero == 3 and pp > 1):
                continue
            plans.append(Plan(dp, tp, pp, zero, m, recompute))
    return plans


@dataclass
class Ranked:
    plan: Plan
    memory: dict
    time: dict
    fits: bool
    notes: list = field(default_factory=list)


def rank_plans(model: Transformer, cluster: Cluster, **options) -> list[Ranked]:
    """All candidate plans with their predictions: the ones that fit first, fastest first, and
    of equally fast ones the one that needs less memory."""
    out = []
    for plan in candidate_plans(model, cluster, **options):
        mem = memory(model, plan)
        out.append(Ranked(plan, mem, step_time(model, cluster, plan),
                          mem["total"] <= cluster.memory))
    return sorted(out, key=lambda r: (not r.fits, round(r.time["total"], 6), r.memory["total"]))


def why(best: Ranked, other: Ranked) -> str:
    """Why ``other`` loses to ``best``: it does not fit, or the term that costs it most."""
    if not other.fits:
        return (f"{other.plan}: needs {other.memory['total'] / 2**30:.1f} GiB per GPU "
                f"({other.memory['state'] / 2**30:.1f} state, "
                f"{other.memory['activations'] / 2**30:.1f} activations)")
    if other.time["total"] <= 1.005 * best.time["total"]:
        return (f"{other.plan}: as fast as the best, but it needs "
                f"{other.memory['total'] / 2**30:.1f} GiB per GPU against "
                f"{best.memory['total'] / 2**30:.1f}")
    terms = [k for k in best.time if k != "total"]
    worst = max(terms, key=lambda k: other.time[k] - best.time[k])
    extra = other.time[worst] - best.time[worst]
    return (f"{other.plan}: {other.time['total'] / best.time['total']:.2f} x the best step, most "
            f"of it {worst.replace('_', ' ')} (+{extra * 1e3:.0f} ms)")
