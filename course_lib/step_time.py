"""Step time of a parallel plan, term by term, with the earlier lessons' rules (lesson 12).

Lecture: the seed article's "choose a strategy" step. Every term is an earlier lesson's:

* **compute**: the busiest pipeline stage's hardware FLOPs (:mod:`course_lib.plans`) at the
  cluster's kernel speed, for each of its m micro-batches;
* **tensor parallel**: Megatron's all-reduces of a layer's activations, 4 per layer and
  micro-batch (2 forward, 2 backward; 6 with full recomputation, whose forward runs again),
  not overlapped (lesson 5);
* **bubble**: the pipeline's fill and drain, (p - 1)/(v m) of the compute for equal stages
  (lessons 5 and 11), and in general (sum of the stages' times - the slowest's) / v;
* **pipeline**: the sends between stages, each 1/t of an activation per GPU (Megatron's
  scatter/gather, Narayanan et al. 2021, section 4.1), v times as many when interleaved;
* **context parallel**: an ideal ring's key/value blocks (Liu et al. 2023), cp - 1 sends per
  layer and micro-batch forward and twice that backward (the blocks, then their gradients), less
  what attention's own compute beside them hides. Every GPU computes on a cp-th of each
  sequence's tokens (the load-balanced split), and the gradients are averaged over the dp x cp
  GPUs that hold the same layers. (``train_gpt``'s ring, written to be read, sends one pass more
  in backward and overlaps only its forward);
* **expert parallel**: a mixture of experts' two all-to-alls per layer and micro-batch forward
  (dispatch and combine, each of a GPU's tokens x top_k x h numbers) and two backward (four
  with full recomputation), among the ep GPUs (:func:`course_lib.cost_models.all_to_all_time`),
  less what compute beside them hides. Dispatch, experts and combine wait for each other, so
  with ``overlap`` this assumes a schedule that runs another micro-batch's compute beside them
  (DeepSeek-V3's DualPipe); without one (``overlap=False``) they all add;
* **data parallel**: the gradient collectives less what the compute beside them hides
  (lesson 10). With accumulation the one all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1) can
  hide only under the *last* micro-batch's backward, and the last bucket under nothing; ZeRO-1
  and -2 gather the updated parameters under the next step's first forward; ZeRO-2
  reduce-scatters every micro-batch and ZeRO-3 also gathers every layer's parameters for each
  micro-batch's forward and backward, each under that micro-batch's compute. Every bucket (a
  layer's gradients, at least DDP's 25 MiB; ZeRO-3's unit of gathering) pays the ring's
  latency, and communication that overlaps compute still slows it: by 18.9% on average in Lee
  et al. 2025's measurements on A100, H100 and AMD GPUs (arXiv 2507.03114), the figure used
  here. A routed expert's gradients (and ZeRO's shards of it) go over the dp x cp / ep GPUs
  that hold it: none when ep = dp x cp.
"""

from __future__ import annotations

import math

from course_lib.cost_models import all_to_all_time, ring_all_reduce_time
from course_lib.plan_checks import check_split
from course_lib.plans import Cluster, Plan, Transformer
from course_lib.stages import (
    gathered_units,
    layer_parameters_held,
    micro_batch_tokens,
    stage_expert_parameters,
    stage_layers,
    stage_parameters,
)

BUCKET_BYTES = 25 * 2**20
OVERLAP_SLOWDOWN = 0.189
TERMS = ("compute", "bubble", "tensor_parallel", "pipeline", "context_parallel",
         "expert_parallel", "data_parallel")


def stage_seconds(model: Transformer, cluster: Cluster, plan: Plan) -> list[dict]:
    """Each pipeline stage's seconds for one micro-batch: ``forward`` and ``backward`` compute
    (backward includes what it recomputes) and the ``tensor_parallel`` all-reduces."""
    tokens = micro_batch_tokens(model, plan)
    per = model.forward_flops_per_token()
    again = model.recomputed_flops_per_token(plan.recompute, plan.attention)
    activation = model.value_bytes * tokens * model.hidden
    alpha, beta = cluster.link(plan.tp, 1)
    one = float(ring_all_reduce_time(activation, plan.tp, alpha, beta)) if plan.tp > 1 else 0.0
    out = []
    for s, n in enumerate(stage_layers(model, plan)):
        head = per["head"] if s == plan.pp - 1 else 0.0
        forward = (n * per["layer"] + head) * tokens / plan.tp
        backward = (n * (2 * per["layer"] + again) + 2 * head) * tokens / plan.tp
        out.append(dict(forward=forward / cluster.speed, backward=backward / cluster.speed,
                        tensor_parallel=n * (6 if plan.recompute else 4) * one))
    return out


def exposed(comm: float, window: float, first: float, slowdown: float | None = None) -> float:
    """Seconds ``comm`` seconds of communication add beside ``window`` seconds of compute: what
    sticks out of the window -- at least ``first``, the message nothing can hide (the last
    gradient bucket, the first layer's gather) -- plus the compute slowed while they overlap,
    by ``slowdown`` of the overlapped time (default :data:`OVERLAP_SLOWDOWN`)."""
    slowdown = OVERLAP_SLOWDOWN if slowdown is None else slowdown
    out = max(comm - window, min(first, comm))
    return out + slowdown * (comm - out)


def _collective(n_bytes: float, p: int, alpha: float, beta: float, buckets: int,
                kind: str) -> float:
    """A ring all-reduce (or a reduce-scatter / all-gather, half of one) of ``n_bytes`` sent in
    ``buckets`` messages, each paying the ring's latency."""
    ring = float(ring_all_reduce_time(n_bytes, p, 0.0, beta)) + 2 * (p - 1) * alpha * buckets
    return ring if kind == "all-reduce" else ring / 2


def stage_data_parallel_seconds(model: Transformer, plan: Plan, psi: float, t: dict, layers: int,
                                alpha: float, beta: float, overlap: bool) -> tuple:
    """One stage's data-parallel seconds, ``(per_step, end)``: what its collectives expose during
    the step, and what the one after its last backward exposes. ``psi``: the parameters one GPU
    of the stage holds, as many as the dp x cp GPUs' collectives cost (:func:`ring_equivalent`);
    ``t``: its :func:`stage_seconds`; ``alpha``, ``beta``: the data-parallel group's link."""
    m = plan.micro_batches
    layer_bytes = model.value_bytes * layer_parameters_held(model, plan)
    units = gathered_units(model, plan)
    grads = model.value_bytes * psi
    if plan.zero == 3:  # one gather (or reduce-scatter) per unit, and for the embeddings
        buckets = layers * units + 1
    else:  # a layer's gradients, at least DDP's 25 MiB
        buckets = max(1, math.ceil(grads / max(BUCKET_BYTES, layer_bytes)))
    bucket = grads / buckets

    def cost(kind, n_bytes=grads, count=buckets):
        return _collective(n_bytes, plan.dp * plan.cp, alpha, beta, count, kind)

    def hide(comm, window, first):
        return exposed(comm, window if overlap else 0.0, first)

    fwd, bwd = t["forward"], t["backward"]
    reduce, gather = cost("reduce-scatter"), cost("all-gather")
    last_rs, last_ag = cost("reduce-scatter", bucket, 1), cost("all-gather", bucket, 1)
    end, per_step = 0.0, 0.0  # end: after the last backward; per_step: the rest
    if plan.zero == 0:
        end = hide(cost("all-reduce"), bwd, cost("all-reduce", bucket, 1))
    elif plan.zero in (1, 2):
        end = hide(reduce, bwd, last_rs)
        per_step = hide(gather, fwd, last_ag)
        if plan.zero == 2:  # every other micro-batch's gradients too, under its compute
            per_step += (m - 1) * hide(reduce, fwd + bwd, last_rs)
    else:  # gathers again for a recomputed forward when it gathers matrix by matrix
        again = 2 if plan.recompute and plan.gather_unit == "matrix" else 1
        per_step = m * (hide(gather, fwd, last_ag)
                        + hide(again * gather + reduce, bwd, last_rs))
    return per_step, end


def data_parallel_seconds(model: Transformer, cluster: Cluster, plan: Plan, stages: list[dict],
                          overlap: bool = True) -> float:
    """The exposed data-parallel time of the step (the module's docstring says what hides
    where); ``overlap=False``: nothing hides (a step that all-reduces after backward)."""
    if plan.dp * plan.cp == 1:
        return 0.0
    # the dp x cp GPUs with the same layers: cp of them tp apart, dp apart by tp x cp x pp
    alpha, beta = (cluster.link(plan.cp, plan.tp) if plan.dp == 1 else
                   cluster.link(plan.dp * plan.cp, plan.tp * plan.pp))
    worst, slack, cache = 0.0, 0.0, {}  # stages alike cost alike: each kind computed once
    for held, experts, t, layers in zip(stage_parameters(model, plan),
                                        stage_expert_parameters(model, plan), stages,
                                        stage_layers(model, plan), strict=True):
        psi = ring_equivalent(held, experts, plan)
        key = (psi, t["forward"], t["backward"], layers)
        if key not in cache:
            cache[key] = stage_data_parallel_seconds(model, plan, psi, t, layers, alpha, beta,
                                                     overlap)
        per_step, end = cache[key]
        # stage s's end-of-step collective can also hide under the backward still to come on
        # the stages before it (they finish later)
        worst = max(worst, per_step + max(0.0, end - slack))
        slack += t["backward"] / plan.chunks
    return worst


def ring_equivalent(held: float, experts: float, plan: Plan) -> float:
    """The parameters whose collective over the dp x cp GPUs costs what ``held`` parameters'
    do, ``experts`` of them going over only the dp x cp / ep GPUs that hold each expert: a ring
    sends (p - 1)/p of its data, so they count (p_e - 1)/p_e over (p - 1)/p (0 for p_e = 1)."""
    p, p_e = plan.dp * plan.cp, plan.dp * plan.cp // plan.ep
    return held - experts + experts * ((p_e - 1) / p_e) / ((p - 1) / p)


def pipeline_seconds(model: Transformer, cluster: Cluster, plan: Plan) -> float:
    """The sends between stages on the critical path: one forward and one backward per
    micro-batch and chunk, plus the fill, each 1/t of an activation."""
    if plan.pp == 1:
        return 0.0
    alpha, beta = cluster.link(plan.pp, plan.tp * plan.cp)
    activation = model.value_bytes * micro_batch_tokens(model, plan) * model.hidden
    sends = 2 * (plan.chunks * plan.micro_batches + plan.pp - 1)
    return sends * (alpha + beta * activation / plan.tp)


def context_parallel_seconds(model: Transformer, cluster: Cluster, plan: Plan, layers: int,
                             overlap: bool = True) -> float:
    """Ring attention's exposed sends in one micro-batch on a stage of ``layers`` layers: per
    layer, cp - 1 key/value blocks forward and 2 (cp - 1) blocks backward (keys and values,
    then their gradients), each 2 k tokens / t numbers (k: the key width), beside attention's
    compute (4 h s FLOPs a token forward, twice that backward)."""
    if plan.cp == 1:
        return 0.0
    alpha, beta = cluster.link(plan.cp, plan.tp)
    tokens = micro_batch_tokens(model, plan)
    block = 2 * model.value_bytes * tokens * model.kv_width / plan.tp
    sends = 3 * (plan.cp - 1) * (alpha + beta * block)
    attention = 3 * 4 * model.hidden * model.seq * tokens / plan.tp / cluster.speed
    return layers * exposed(sends, attention if overlap else 0.0, 0.0)


def expert_parallel_seconds(model: Transformer, cluster: Cluster, plan: Plan, t: dict,
                            layers: int, overlap: bool = True) -> float:
    """The experts' exposed all-to-alls in one micro-batch on a stage of ``layers`` layers whose
    compute is ``t`` (:func:`stage_seconds`): per layer, 4 all-to-alls (6 with full
    recomputation) of tokens x top_k x h values per GPU among the ep GPUs of a group
    (data-parallel neighbours: tp x cp x pp apart), beside that layer's compute."""
    if plan.ep == 1:
        return 0.0
    alpha, beta = cluster.link(plan.ep, plan.tp * plan.cp * plan.pp)
    routed = model.value_bytes * micro_batch_tokens(model, plan) * model.top_k * model.hidden
    comm = (6 if plan.recompute else 4) * float(all_to_all_time(routed, plan.ep, alpha, beta))
    window = (t["forward"] + t["backward"]) / layers if overlap else 0.0
    return layers * exposed(comm, window, 0.0)


def step_time(model: Transformer, cluster: Cluster, plan: Plan, overlap: bool = True) -> dict:
    """Predicted seconds of one step, term by term (:data:`TERMS`), and their ``total``.
    ``overlap``: the data-parallel collectives run beside the compute (DDP, FSDP, lesson 10);
    False for a step that all-reduces after backward (:mod:`course_lib.train_gpt`)."""
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap must be True or False, got {overlap!r}")
    check_split(model, plan)
    if plan.gpus > cluster.gpus:
        raise ValueError(f"the plan needs dp x cp x tp x pp = {plan.gpus} GPUs, the cluster "
                         f"has {cluster.gpus}")
    stages = stage_seconds(model, cluster, plan)
    busy = [t["forward"] + t["backward"] + t["tensor_parallel"] for t in stages]
    slowest = max(range(plan.pp), key=busy.__getitem__)
    m = plan.micro_batches
    out = dict(compute=m * (stages[slowest]["forward"] + stages[slowest]["backward"]),
               bubble=(sum(busy) - busy[slowest]) / plan.chunks,
               tensor_parallel=m * stages[slowest]["tensor_parallel"],
               pipeline=pipeline_seconds(model, cluster, plan),
               context_parallel=m * context_parallel_seconds(
                   model, cluster, plan, stage_layers(model, plan)[slowest], overlap),
               expert_parallel=m * expert_parallel_seconds(
                   model, cluster, plan, stages[slowest], stage_layers(model, plan)[slowest],
                   overlap),
               data_parallel=data_parallel_seconds(model, cluster, plan, stages, overlap))
    out["total"] = sum(out.values())
    return out


def collectives(model: Transformer, plan: Plan) -> int:
    """Collectives and sends one GPU of the busiest stage issues in a step: fewer is the
    tie-break between plans predicted equally fast (each one is a chance to wait)."""
    layers = max(stage_layers(model, plan))
    m = plan.micro_batches
    tp = layers * (6 if plan.recompute else 4) * m if plan.tp > 1 else 0
    pp = 2 * plan.chunks * m if plan.pp > 1 else 0
    cp = 3 * (plan.cp - 1) * layers * m
    ep = (6 if plan.recompute else 4) * layers * m if plan.ep > 1 else 0
    dp = 0
    if plan.dp * plan.cp > 1:
        dp = {0: 1, 1: 2, 2: m + 1, 3: 3 * layers * gathered_units(model, plan) * m}[plan.zero]
    return tp + pp + cp + ep + dp
