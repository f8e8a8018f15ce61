"""Memory per GPU of a parallel plan: training state plus activations, stage by stage (lesson 12).

Lecture: the seed article's "choose a strategy" step; lessons 5 (1F1B keeps at most p - s
micro-batches in flight on stage s), 10 (recomputation), 11 (ZeRO, interleaving). Sources:
Rajbhandari et al. 2020 (ZeRO's 16 bytes a parameter); Korthikanti et al. 2022 (a layer's
activations, Table 2: s b h (10 + 24/t + 5 a s/(h t)) bytes; selective recomputation and
sequence parallelism); Narayanan et al. 2021 (interleaved 1F1B's first stage keeps
1 + (p - 1)/(p v) times 1F1B's activations); Dao et al. 2022 (FlashAttention keeps no s x s
scores, only a log-sum-exp per head and token).
"""

from __future__ import annotations

import numbers
from dataclasses import replace

from course_lib.cost_models import check_processes, zero_bytes_per_rank
from course_lib.plan_checks import check_split
from course_lib.plans import Plan, Transformer
from course_lib.stages import (
    layer_parameters_held,
    micro_batch_tokens,
    stage_expert_parameters,
    stage_layers,
    stage_parameters,
)


def state_bytes(psi: float, dp: int, zero: int, value_bytes: int = 2) -> float:
    """Parameters, gradients and Adam's state for ``psi`` parameters over ``dp`` ranks at ZeRO
    stage ``zero``: mixed precision (2-byte values) is ZeRO's 16 bytes a parameter
    (``cost_models.zero_bytes_per_rank``); float32 is 4 + 4 + 8 bytes, and ZeRO shards the 8 of
    Adam's moments (stage 1), then the gradients' 4 (stage 2), then the parameters' 4 (stage 3)."""
    if value_bytes not in (2, 4) or isinstance(value_bytes, bool):
        raise ValueError(f"value_bytes must be 2 (bf16 mixed precision) or 4 (float32), got "
                         f"{value_bytes!r}")
    check_processes(dp, "dp")
    mixed = zero_bytes_per_rank(psi, dp, zero)  # refuses a size, dp or stage that is no such
    if value_bytes == 2:
        return mixed
    return {0: 16 * psi, 1: 8 * psi + 8 * psi / dp, 2: 4 * psi + 12 * psi / dp,
            3: 16 * psi / dp}[zero]


def activation_bytes_per_layer(model: Transformer, plan: Plan) -> float:
    """One layer's activations for one micro-batch on one GPU. Per token, in ``value_bytes``
    numbers (Korthikanti et al. 2022's count, generalised to grouped-query attention and gated
    MLPs): the two norms' inputs and the inputs of QKV and of the MLP (4 h), the two dropout
    masks (2 h bytes), all replicated over the t tensor-parallel GPUs unless the plan is
    ``sequence_parallel``; q, k, v and attention's output (2 h + 2 k), the MLP's hidden values
    (the MLP's input to its activation and its output, 2 f; gated, 3 f: Megatron-LM's fused
    SwiGLU keeps gate and up and recomputes the activation, and the product feeds the output
    projection) and attention's scores (softmax,
    dropout mask and output, a s numbers each: 5 a s bytes in bf16), split over t. Attention
    ``"recomputed"`` keeps no scores; ``"flash"`` keeps a float32 log-sum-exp per head. For
    GPT-2's shape in bf16: s b h (10 + 24/t + 5 a s / (h t)), Korthikanti et al.'s Table 2.
    With full recomputation only the layer's input, 2 s b h (split over t with sequence
    parallelism). With experts, the hidden values of each of the top_k (and shared) experts a
    token goes to, and each routed copy's input and output (the output for the gate's gradient;
    the capacity's padding left out)."""
    s, h, t, vb = model.seq, model.hidden, plan.tp, model.value_bytes
    tokens = micro_batch_tokens(model, plan)
    replicated_share = 1 / t if plan.sequence_parallel else 1.0
    if plan.recompute:
        return tokens * vb * h * replicated_share
    replicated = 4 * vb * h + (2 * h if model.dropout else 0)
    mlps = model.top_k + model.shared_experts if model.experts else 1
    routed = 2 * model.top_k * vb * h if model.experts else 0  # each copy's input and output
    split = (vb * (2 * h + 2 * model.kv_width) + routed
             + (3 if model.gated_mlp else 2) * vb * model.ffn_width * mlps)
    scores = {"stored": model.heads * s * (vb + (1 + vb if model.dropout else 0)),
              "recomputed": 0, "flash": 4 * model.heads}[plan.attention]
    return tokens * (replicated * replicated_share + (split + scores) / t)


def head_activation_bytes(model: Transformer, plan: Plan) -> float:
    """The last stage's output layer for one micro-batch: the final norm's input and the head's
    input (2 h numbers a token, replicated unless sequence parallel) and the float32 logits the
    loss keeps for backward (4 V bytes, split over the vocabulary-parallel t GPUs)."""
    t = plan.tp
    tokens = micro_batch_tokens(model, plan)
    replicated = 2 * model.value_bytes * model.hidden / (t if plan.sequence_parallel else 1)
    return tokens * (replicated + 4 * model.vocab / t)


def tiny_gpt_bytes_per_layer(model: Transformer, plan: Plan) -> float:
    """The same for :class:`course_lib.models.TinyGPT` (no dropout; CPU attention keeps no
    s x s scores): per token the 16 h numbers and the statistics of
    ``recomputation.block_activation_floats``, of which q, k, v, attention's output and the
    MLP's hidden layer (12 h and a log-sum-exp per head) are split over the tensor-parallel
    ranks; with recomputation the block's input, h."""
    h, t = model.hidden, plan.tp
    tokens = micro_batch_tokens(model, plan)
    floats = h if plan.recompute else 4 * h + 4 + (12 * h + model.heads) / t
    return tokens * floats * model.value_bytes


def in_flight(plan: Plan, stage: int) -> float:
    """Micro-batches' worth of its layers' activations stage ``stage`` holds at its peak. 1F1B:
    min(p - s, m) (lesson 5). Interleaved 1F1B with v chunks: Megatron-LM's warm-up of
    2 (p - s - 1) + (v - 1) p chunk forwards, plus the one in flight, each a v-th of the stage
    (``interleaving.interleaved_order``); on the first stage p (1 + (p - 1)/(p v)). Without a
    pipeline, one micro-batch at a time."""
    p, m, v = plan.pp, plan.micro_batches, plan.chunks
    if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) or not 0 <= stage < p:
        raise ValueError(f"stage must be a whole number from 0 to pp - 1 = {p - 1}, got {stage!r}")
    if p == 1:
        return 1.0
    if v == 1:
        return float(min(p - stage, m))
    return min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1) / v


def memory(model: Transformer, plan: Plan, per_layer=activation_bytes_per_layer,
           per_head=head_activation_bytes) -> dict:
    """Predicted bytes per GPU on the stage that needs most: ``state`` (parameters, gradients,
    optimizer state of its share, :func:`state_bytes`, an expert's over the dp x cp / ep
    GPUs that hold it; ZeRO-3 adds two units' gathered
    parameters, the one computing and the one prefetched: blocks, or the largest matrix),
    ``activations`` (``per_layer`` bytes for each of its layers and each micro-batch
    :func:`in_flight`; with recomputation, the
    recomputed layer's activations beyond its kept input while backward recomputes it; on the
    last stage ``per_head``, None for none), their ``total``, and ``stage``, which stage it is."""
    check_split(model, plan)
    layers = stage_layers(model, plan)
    kept = per_layer(model, plan)
    working = 0.0
    if plan.recompute:
        working = per_layer(model, replace(plan, recompute=False)) - kept
    elif plan.attention == "recomputed":
        working = per_layer(model, replace(plan, attention="stored")) - kept
    gathered = 0.0
    if plan.zero == 3 and plan.dp * plan.cp > 1:
        unit = (layer_parameters_held(model, plan) if plan.gather_unit == "block" else
                (model.ffn_width + 1) * model.hidden / plan.tp)
        gathered = 2 * model.value_bytes * unit
    best, states = None, {}
    for s, (n, psi, experts) in enumerate(zip(layers, stage_parameters(model, plan),
                                               stage_expert_parameters(model, plan), strict=True)):
        if psi not in states:
            shards = plan.dp * plan.cp  # ZeRO shards over the ranks with the same layers
            states[psi] = (state_bytes(psi - experts, shards, plan.zero, model.value_bytes)
                           + state_bytes(experts, shards // plan.ep, plan.zero, model.value_bytes)
                           + gathered)
        state = states[psi]
        acts = in_flight(plan, s) * n * kept + working
        if s == plan.pp - 1 and per_head is not None:
            acts += per_head(model, plan)
        if best is None or state + acts > best["total"]:
            best = dict(state=state, activations=acts, total=state + acts, stage=s)
    return best
