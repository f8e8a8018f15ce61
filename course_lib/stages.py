"""Each GPU's share of a plan: its pipeline stage's layers, its parameters, its micro-batch.

Lecture: model parallelism (a network split by layers over ranks, lesson 5) and the seed
article's "choose a strategy" step (lesson 12). :mod:`course_lib.gpu_memory` and
:mod:`course_lib.step_time` count memory and time from these shares.
"""

from __future__ import annotations

from course_lib.plans import Plan, Transformer, check_positive


def balanced_stages(layers: int, pp: int) -> tuple:
    """``layers`` over ``pp`` stages as evenly as they go, the lighter stages at the two ends,
    where the embedding and the head sit: 70 over 12 is 5+6x10+5 (BLOOM), 126 over 16 is
    7+8x14+7 (Llama 3 405B: "we reduce one Transformer layer each from the first and the last
    stages", Dubey et al. 2024, section 3.3.2)."""
    check_positive("balanced_stages", layers=layers, pp=pp)
    if pp > layers:
        raise ValueError(f"{layers} layers cannot fill {pp} pipeline stages")
    q, r = divmod(int(layers), int(pp))  # Python's ints, also for numpy's
    light = pp - r
    return (q,) * (light // 2) + (q + 1,) * r + (q,) * (light - light // 2)


def gathered_units(model: Transformer, plan: Plan) -> int:
    """ZeRO-3's gathers per layer: one block, or its weight matrices (q, k and v fused, the
    output projection, and the MLP's two, or three gated)."""
    if plan.gather_unit == "block":
        return 1
    return 5 if model.gated_mlp else 4


def stage_layers(model: Transformer, plan: Plan) -> tuple:
    """Layers on each pipeline stage: ``plan.stages``, or equal shares."""
    if plan.stages is not None:
        if sum(plan.stages) != model.layers:
            raise ValueError(f"Plan.stages {plan.stages} hold {sum(plan.stages)} layers, the "
                             f"model has {model.layers}")
        return plan.stages
    if model.layers % plan.pp:
        raise ValueError(f"pp = {plan.pp} does not divide the {model.layers} layers: give "
                         f"Plan.stages (planner.balanced_stages({model.layers}, {plan.pp}))")
    return (model.layers // plan.pp,) * plan.pp


def micro_batch_size(model: Transformer, plan: Plan) -> float:
    """Sequences per micro-batch on one data-parallel rank."""
    return model.global_batch / (plan.dp * plan.micro_batches)


def micro_batch_tokens(model: Transformer, plan: Plan) -> float:
    """Tokens of one micro-batch on one GPU: its sequences' tokens, split over the cp ranks of
    context parallelism."""
    return model.seq * micro_batch_size(model, plan) / plan.cp


def stage_parameters(model: Transformer, plan: Plan) -> list[float]:
    """Parameters one GPU of each stage holds: its layers, the embedding on the first stage and
    the head on the last (a tied head is a second copy of the embedding there, whose gradients
    Megatron-LM adds to the first stage's), all divided over the tensor-parallel group; of the
    routed experts, a 1/ep share (:func:`stage_expert_parameters`)."""
    layers = stage_layers(model, plan)
    out = []
    for s, n in enumerate(layers):
        count = n * (model.layer_parameters - model.expert_parameters)
        count += model.embedding_parameters if s == 0 else 0
        if s == plan.pp - 1:
            count += model.head_parameters
            count += model.vocab * model.hidden if model.tied_head and plan.pp > 1 else 0
        out.append(count / plan.tp + n * model.expert_parameters / (plan.tp * plan.ep))
    return out


def layer_parameters_held(model: Transformer, plan: Plan) -> float:
    """One layer's parameters on one GPU: the layer over the tensor-parallel group, of its
    routed experts only a 1/ep share (ZeRO-3 gathers this much a block; a bucket holds it)."""
    return (model.layer_parameters - model.expert_parameters
            + model.expert_parameters / plan.ep) / plan.tp


def stage_expert_parameters(model: Transformer, plan: Plan) -> list[float]:
    """Of :func:`stage_parameters`, the routed experts' share: each GPU holds experts / ep of
    each of its layers' experts (0 for a model without experts)."""
    return [n * model.expert_parameters / (plan.tp * plan.ep) for n in stage_layers(model, plan)]
