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
from dataclasses import dataclass, field, replace

from course_lib.cost_models import ring_all_reduce_time, zero_bytes_per_rank


@dataclass(frozen=True)
class Transformer:
    """A GPT-style model: ``layers`` blocks of width ``hidden`` with ``heads`` heads, sequences of
    ``seq`` tokens, a vocabulary of ``vocab``, ``global_batch`` sequences per step.
    ``value_bytes``: 2 for bf16 mixed precision (Megatron's, ZeRO's), 4 for float32 throughout
    (this course's runs). ``tied_head``: the output layer reuses the token embedding (GPT-2,
    Megatron); :class:`course_lib.models.TinyGPT` has its own head and final norm."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    global_batch: int
    value_bytes: int = 2
    tied_head: bool = True

    @property
    def parameters(self) -> int:
        """12 h^2 + 13 h per block (attention 4 h^2 + 4 h, MLP 8 h^2 + 5 h, two LayerNorms 4 h),
        plus token and position embeddings; an untied head adds its weight and bias and the
        final norm."""
        h = self.hidden
        head = 0 if self.tied_head else self.vocab * h + self.vocab + 2 * h
        return self.layers * (12 * h * h + 13 * h) + (self.vocab + self.seq) * h + head

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


def micro_batch_size(model: Transformer, plan: Plan) -> float:
    """Sequences per micro-batch on one data-parallel rank."""
    return model.global_batch / (plan.dp * plan.micro_batches)


def state_bytes(psi: float, dp: int, zero: int, value_bytes: int = 2) -> float:
    """Parameters, gradients and Adam's state for ``psi`` parameters over ``dp`` ranks at ZeRO
    stage ``zero``: mixed precision (2-byte values) is ZeRO's 16 bytes a parameter
    (``cost_models.zero_bytes_per_rank``); float32 is 4 + 4 + 8 bytes, and ZeRO shards the 8 of
    Adam's moments (stage 1), then the gradients' 4 (stage 2), then the parameters' 4 (stage 3)."""
    if value_bytes == 2:
        return zero_bytes_per_rank(psi, dp, zero)
    if value_bytes != 4:
        raise ValueError(f"value_bytes must be 2 (bf16 mixed precision) or 4 (float32), got "
                         f"{value_bytes}")
    return {0: 16 * psi, 1: 8 * psi + 8 * psi / dp, 2: 4 * psi + 12 * psi / dp,
            3: 16 * psi / dp}[zero]


def activation_bytes_per_layer(model: Transformer, plan: Plan) -> float:
    """One layer's activations for one micro-batch on one GPU, Megatron's GPT in bf16 with
    dropout (Korthikanti et al. 2022, Table 2, no sequence parallelism):
    s b h (10 + 24/t + 5 a s / (h t)) bytes; with full recomputation only the layer's input,
    2 s b h."""
    s, h, a, t = model.seq, model.hidden, model.heads, plan.tp
    b = micro_batch_size(model, plan)
    if plan.recompute:
        return model.value_bytes * s * b * h
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def tiny_gpt_bytes_per_layer(model: Transformer, plan: Plan) -> float:
    """The same for :class:`course_lib.models.TinyGPT` (no dropout; CPU attention keeps no
    s x s scores): per token the 16 h numbers and the statistics of
    ``recomputation.block_activation_floats``, of which q, k, v, attention's output and the
    MLP's hidden layer (12 h and a log-sum-exp per head) are split over the tensor-parallel
    ranks; with recomputation the block's input, h."""
    h, t = model.hidden, plan.tp
    tokens = model.seq * micro_batch_size(model, plan)
    floats = h if plan.recompute else 4 * h + 4 + (12 * h + model.heads) / t
    return tokens * floats * model.value_bytes


def memory(model: Transformer, plan: Plan, per_layer=activation_bytes_per_layer) -> dict:
    """Predicted bytes per GPU: ``state`` (parameters, gradients, optimizer of this GPU's
    share, :func:`state_bytes`) and ``activations`` (``per_layer`` bytes for each of the stage's
    layers and each of the min(pp, m) micro-batches the first stage keeps in flight under 1F1B;
    with recomputation, plus one layer's whole activations while backward recomputes it), and
    their ``total``."""
    share = model.parameters / (plan.tp * plan.pp)
    state = state_bytes(share, plan.dp, plan.zero, model.value_bytes)
    in_flight = min(plan.pp, plan.micro_batches)
    acts = model.layers / plan.pp * in_flight * per_layer(model, plan)
    if plan.recompute:
        acts += per_layer(model, replace(plan, recompute=False))
    return dict(state=state, activations=acts, total=state + acts)


def step_time(model: Transformer, cluster: Cluster, plan: Plan, overlap: bool = True) -> dict:
    """Predicted seconds of one step, term by term, and their ``total``. ``overlap``: the
    data-parallel all-reduce runs under backward (DDP, lesson 10); False for a step that
    all-reduces after backward (:mod:`course_lib.train_gpt`)."""
    compute = model.flops_per_step(plan.recompute) / (cluster.gpus * cluster.peak_flops
                                                       * cluster.mfu)
    bubble = compute * (plan.pp - 1) / plan.micro_batches
    b = micro_batch_size(model, plan)
    activation = model.value_bytes * model.seq * b * model.hidden
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
    if plan.dp > 1:  # the gradients (and ZeRO-3's parameters) of this GPU's share
        alpha, beta = cluster.link(plan.dp, plan.tp * plan.pp)
        grads = model.value_bytes * model.parameters / (plan.tp * plan.pp)
        # in all-reduces' worth (a reduce-scatter or an all-gather is half of one): ZeRO-0/1
        # one a step; ZeRO-2 keeps no whole gradient, so it reduce-scatters every micro-batch
        # and gathers the parameters once; ZeRO-3 gathers them for every micro-batch's forward
        # and backward too (1.5 m)
        rounds = {0: 1, 1: 1, 2: (plan.micro_batches + 1) / 2, 3: 1.5 * plan.micro_batches}
        total = rounds[plan.zero] * float(ring_all_reduce_time(grads, plan.dp, alpha, beta))
        # what can hide it: backward (2/3 of the compute); ZeRO-3's gathers also prefetch
        # under forward
        hidden = (compute if plan.zero == 3 else 2 / 3 * compute) if overlap else 0.0
        dp = max(0.0, total - hidden)
    out = dict(compute=compute, bubble=bubble, tensor_parallel=tp, pipeline=pp,
               data_parallel=dp)
    out["total"] = sum(out.values())
    return out


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def candidate_plans(model: Transformer, cluster: Cluster, zero_stages=(0, 1, 2, 3),
                    micro_batch_sizes=(1, 2, 4, 8, 16, 32)) -> list[Plan]:
    """Every plan that uses all GPUs: tp divides the heads and a node's GPUs (each group inside
    one node), pp divides
    the layers, each data-parallel rank's share of the global batch splits into m micro-batches
    of one of ``micro_batch_sizes`` sequences (without pipelining, m is gradient
    accumulation; with it, at least pp, as 1F1B needs); ZeRO-3 only without pipelining (it
    would gather every stage's parameters once per micro-batch)."""
    n = cluster.gpus
    plans = []
    for tp in divisors(n):
        if model.heads % tp or cluster.gpus_per_node % tp:  # a group inside one node
            continue
        for pp in divisors(n // tp):
            if model.layers % pp:
                continue
            dp = n // (tp * pp)
            if model.global_batch % dp:
                continue
            per_rank = model.global_batch // dp
            for zero, b, recompute in itertools.product(zero_stages, micro_batch_sizes,
                                                        (False, True)):
                m = per_rank // b
                if per_rank % b or (zero == 3 and pp > 1) or (pp > 1 and m < pp):
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


def rank_plans(model: Transformer, cluster: Cluster, per_layer=activation_bytes_per_layer,
               overlap: bool = True, **options) -> list[Ranked]:
    """All candidate plans (``options`` go to :func:`candidate_plans`) with their predictions:
    the ones that fit first, fastest first, and of equally fast ones the one that needs less
    memory. ``per_layer`` and ``overlap`` as in :func:`memory` and :func:`step_time`."""
    out = []
    for plan in candidate_plans(model, cluster, **options):
        mem = memory(model, plan, per_layer)
        out.append(Ranked(plan, mem, step_time(model, cluster, plan, overlap),
                          mem["total"] <= cluster.memory))
    return sorted(out, key=lambda r: (not r.fits, round(r.time["total"], 6), r.memory["total"]))


def size(n_bytes: float) -> str:
    """Bytes in GiB, or MiB below one GiB (a small model's plans differ below 0.1 GiB)."""
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.2f} MiB"


def why(best: Ranked, other: Ranked) -> str:
    """Why ``other`` loses to ``best``: it does not fit, or the term that costs it most."""
    if not other.fits:
        return (f"{other.plan}: needs {size(other.memory['total'])} per GPU "
                f"({size(other.memory['state'])} state, "
                f"{size(other.memory['activations'])} activations)")
    if other.time["total"] <= 1.005 * best.time["total"]:
        return (f"{other.plan}: as fast as the best, but it needs "
                f"{size(other.memory['total'])} per GPU against {size(best.memory['total'])}")
    terms = [k for k in best.time if k != "total"]
    worst = max(terms, key=lambda k: other.time[k] - best.time[k])
    extra = other.time[worst] - best.time[worst]
    return (f"{other.plan}: {other.time['total'] / best.time['total']:.2f} x the best step, most "
            f"of it {worst.replace('_', ' ')} (+{extra * 1e3:.0f} ms)")


def torchrun_command(model: Transformer, cluster: Cluster, plan: Plan, steps: int = 10) -> str:
    """The command that runs ``plan`` with :mod:`course_lib.train_gpt` on every node of
    ``cluster``. One node: ``--standalone`` (torchrun picks a free port). Several: the same
    command on each node, with the rendezvous host and a free port of your choosing in
    $HEAD_NODE and $PORT (a fixed port collides with other jobs)."""
    where = ("--standalone" if cluster.nodes == 1 else
             f"--nnodes {cluster.nodes} --rdzv-backend c10d --rdzv-endpoint $HEAD_NODE:$PORT")
    flags = (f"--dp {plan.dp} --tp {plan.tp} --pp {plan.pp} --zero {plan.zero} "
             f"--micro-batches {plan.micro_batches}{' --recompute' if plan.recompute else ''}")
    shape = (f"--layers {model.layers} --d-model {model.hidden} --heads {model.heads} "
             f"--context {model.seq} --vocab {model.vocab} --global-batch {model.global_batch}")
    return (f"torchrun {where} --nproc-per-node {cluster.gpus_per_node} -m course_lib.train_gpt "
            f"{flags} {shape} --steps {steps}")
