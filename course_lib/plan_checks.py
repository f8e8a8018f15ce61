"""The rules a plan obeys, which plans :mod:`course_lib.train_gpt` runs exactly, and what to
change in one that breaks them.

Lecture: the seed article's "choose a strategy" step. A :class:`course_lib.plans.Plan` says how a
step is split (dp x tp x pp, ZeRO, micro-batches, recomputation, ...); the planner predicts any
plan, but train_gpt runs the ones whose split is exact for its small GPT: tensor parallelism
splits whole heads, pipeline parallelism whole layers (equal stages), the global batch splits
into dp x m equal micro-batches, 1F1B has at least as many micro-batches as stages. Everything
here is refused before any work, with what to change; the planner's ``torchrun_command`` and
train_gpt's command line ask the same questions. :func:`plan_conflicts` holds the rules every
plan obeys, whoever runs it: the planner keeps the plans without a conflict, train_gpt refuses
a plan with one, in the same words.
"""

from __future__ import annotations

import numbers

from course_lib.model_shapes import check_positive
from course_lib.plans import Plan

# the fields of a Plan that train_gpt reads (the others must keep their defaults)
PLAN_FIELDS = ("dp", "tp", "pp", "cp", "ep", "zero", "micro_batches", "recompute")


def plan_of(plan: Plan | None = None, **fields) -> Plan:
    """``plan`` itself, or a :class:`Plan` made of its fields (dp, tp, pp default 1): the two
    ways train_gpt is told its plan. Giving both, or a field it does not know, is refused."""
    if plan is not None:
        if fields:
            raise ValueError(f"give a Plan or its fields ({', '.join(sorted(fields))}), not both")
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a course_lib.plans.Plan, got {type(plan).__name__}")
        return plan
    if unknown := sorted(set(fields) - set(PLAN_FIELDS)):
        raise TypeError(f"unknown plan fields {unknown}: train_gpt takes {list(PLAN_FIELDS)}")
    fields = dict(dp=1, tp=1, pp=1, cp=1, ep=1) | fields
    if min(fields["dp"], fields["tp"], fields["pp"], fields["cp"], fields["ep"],
           fields.get("micro_batches", 1)) < 1:
        raise ValueError(f"dp, tp, pp, cp, ep and micro_batches must be at least 1, got "
                         f"{fields['dp']}, {fields['tp']}, {fields['pp']}, {fields['cp']}, "
                         f"{fields['ep']}, {fields.get('micro_batches', 1)}")
    if fields.get("zero", 0) not in (0, 1, 2, 3) or isinstance(fields.get("zero"), bool):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {fields.get('zero')!r}")
    return Plan(**fields)


def not_supported(plan: Plan) -> list[str]:
    """What of ``plan`` train_gpt does not run (its attention is PyTorch's
    ``scaled_dot_product_attention`` whatever the plan's ``attention`` says)."""
    return [name for name, used in (
        ("sequence parallelism", plan.sequence_parallel), ("interleaving", plan.chunks > 1),
        ("uneven stages", plan.stages is not None and len(set(plan.stages)) > 1),
        ("selective recomputation", plan.recomputation == "selective")) if used]


def plan_conflicts(plan: Plan, *, layers: int, heads: int, global_batch: int,
                   kv_heads: int | None = None, seq: int | None = None,
                   experts: int = 0) -> list[str]:
    """Why ``plan`` cannot split a model of ``layers`` layers and ``heads`` attention heads
    (``kv_heads`` key/value heads) that trains on ``global_batch`` sequences of ``seq`` tokens
    (None: not checked) a step, with ``experts`` experts in each block (0: dense): each reason
    says what to change; [] when it can. The rules are written here once: the planner keeps the
    plans without a conflict, train_gpt and its command line refuse a plan with one."""
    dp, tp, pp, m, v = plan.dp, plan.tp, plan.pp, plan.micro_batches, plan.chunks
    kv = heads if kv_heads is None else kv_heads
    out = []
    if heads % tp or kv % tp:
        out.append(f"tensor parallelism splits whole heads: tp = {tp} must divide the {heads} "
                   f"heads" + (f" and the {kv} key/value heads" if kv != heads else ""))
    if plan.stages is not None and sum(plan.stages) != layers:
        out.append(f"Plan.stages {plan.stages} hold {sum(plan.stages)} layers, the model has "
                   f"{layers}")
    elif pp > layers:
        out.append(f"pipeline parallelism gives each stage whole layers: pp = {pp} is more "
                   f"than the {layers} layers")
    elif plan.stages is None and layers % pp:
        out.append(f"pp = {pp} does not divide the {layers} layers: give Plan.stages (e.g. "
                   f"balanced_stages({layers}, {pp}))")
    if global_batch % (dp * m):
        out.append(f"the global batch {global_batch} must split into dp x micro_batches = "
                   f"{dp * m} equal micro-batches")
    if pp > 1 and m < pp:
        out.append(f"1F1B needs at least as many micro-batches as stages: micro_batches = {m} "
                   f"< pp = {pp}")
    if plan.zero == 3 and pp > 1:
        out.append("ZeRO-3 (FSDP) with pipeline parallelism gathers every stage's parameters "
                   "once per micro-batch; this course leaves that combination out: use zero "
                   "<= 2 with pp > 1")
    out += context_conflicts(plan, seq)
    if experts and tp > 1:
        out.append("tensor parallelism splits a dense MLP, and this course does not split "
                   "experts over tensor-parallel ranks: use tp = 1 with experts")
    out += expert_conflicts(plan, experts)
    if plan.sequence_parallel and tp == 1:
        out.append("sequence parallelism splits the sequence over the tensor-parallel group: "
                   "it needs tp > 1")
    if plan.recompute and plan.attention == "recomputed":
        out.append("full recomputation already recomputes attention's scores: use "
                   "attention='recomputed' (selective) or recompute=True, not both")
    if v > 1 and m % pp:
        out.append(f"interleaving {v} chunks per rank needs micro_batches a multiple of pp = "
                   f"{pp}, got {m}")
    if v > 1 and pp <= layers:
        per_stage = plan.stages or (layers // pp,) * pp
        if v > max(per_stage) or (plan.stages is None and (layers // pp) % v):
            out.append(f"interleaving cuts each stage into {v} chunks of whole layers: "
                       f"{per_stage} layers per stage do not")
    return out


def expert_conflicts(plan: Plan, experts: int) -> list[str]:
    """Why ``plan``'s ep cannot spread ``experts`` experts a block (0: a dense model); [] when it
    can: ep divides the experts, and the data-parallel ranks it spreads them over."""
    if plan.ep == 1:
        return []
    if not experts:
        return [f"ep = {plan.ep} spreads a model's experts, and this one has none"]
    out = [f"ep = {plan.ep} does not divide the {experts} experts"] if experts % plan.ep else []
    if plan.dp % plan.ep:
        out.append(f"expert parallelism spreads the experts over data-parallel ranks: "
                   f"ep = {plan.ep} must divide dp = {plan.dp}")
    return out


def context_conflicts(plan: Plan, seq: int | None) -> list[str]:
    """Why ``plan``'s cp cannot split sequences of ``seq`` tokens (None: not checked); []."""
    if plan.cp > 1 and seq is not None and seq % (2 * plan.cp):
        return [f"context parallelism's load-balanced (zigzag) split cuts each sequence into "
                f"2 x cp = {2 * plan.cp} equal chunks: {seq} tokens do not split so"]
    return []


def check_split(model, plan: Plan) -> None:
    """Refuse a ``plan`` that cannot split ``model`` (:func:`plan_conflicts`: heads, layers,
    batch, sequence, experts; the planner's predictions ask this first), naming why."""
    if conflicts := plan_conflicts(plan, layers=model.layers, heads=model.heads,
                                   global_batch=model.global_batch, kv_heads=model.kv_heads,
                                   seq=model.seq, experts=model.experts):
        raise ValueError(f"plan {plan}: " + "; ".join(conflicts))


def check_plan(world_size: int, plan: Plan | None = None, *, global_batch: int, layers: int,
               heads: int, seq: int | None = None, experts: int = 0, **fields) -> Plan:
    """Refuse, with what to change, a plan (or its fields) that train_gpt cannot run exactly on
    ``world_size`` ranks; return the plan."""
    check_positive("train_gpt", global_batch=global_batch, layers=layers, heads=heads)
    plan = plan_of(plan, **fields)
    dp, tp, pp, cp = plan.dp, plan.tp, plan.pp, plan.cp
    if missing := not_supported(plan):
        raise ValueError(f"train_gpt does not run {', '.join(missing)}: choose among plans "
                         f"without them (rank_plans(..., sequence_parallel=(False,), "
                         f"chunks=(1,), attention=('stored', 'flash')))")
    if plan.gpus != world_size:
        names, sizes = ("dp x cp x tp x pp", f"{dp} x {cp} x {tp} x {pp}") if cp > 1 else (
            "dp x tp x pp", f"{dp} x {tp} x {pp}")
        raise ValueError(f"{names} = {sizes} = {plan.gpus}, but the job has {world_size} ranks: "
                         f"start {names} processes")
    conflicts = plan_conflicts(plan, layers=layers, heads=heads, global_batch=global_batch,
                               seq=seq, experts=experts)
    if plan.ep > 1 and plan.zero:  # the planner models it (each expert's own shards)
        conflicts.append("train_gpt's ZeRO shards what the data-parallel ranks hold alike; "
                         "with ep > 1 their experts differ: use zero 0")
    if conflicts:
        raise ValueError(f"plan {plan}: " + "; ".join(conflicts))
    return plan


def check_run(steps: int, global_batch: int) -> None:
    """Refuse a run with nothing to do: at least one step, of at least one sequence."""
    whole = [isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in (steps,
                                                                                  global_batch)]
    if not (whole[0] and steps >= 1):
        raise ValueError(f"steps must be at least 1, got {steps!r} (a whole number)")
    if not (whole[1] and global_batch >= 1):
        raise ValueError(f"the global batch must hold at least one sequence, got "
                         f"{global_batch!r} (a whole number)")


def check_precision(precision: str, dtype):
    """The compute dtype of a run in ``precision`` ("fp32": None, the parameters' own; "bf16":
    torch.bfloat16 under autocast, with float32 masters, gradients and gradient reductions;
    tensor parallelism's all-reduces of activations run in bf16, as Megatron-LM's do), refused
    unless the parameters are float32."""
    import torch

    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
    if precision == "bf16" and dtype != torch.float32:
        raise ValueError(f"bf16 mixed precision keeps float32 masters: use dtype=torch.float32, "
                         f"got {dtype}")
    return torch.bfloat16 if precision == "bf16" else None


def check_model(shape: dict) -> None:
    """Refuse, before any work, a model (``train_gpt.MODEL``'s keys) that cannot be built: a size
    below 1, heads that do not split d_model, a vocabulary smaller than the text's 96
    characters, experts below 0 (0: a dense MLP), top_k outside 1 to the experts."""
    if small := [name for name in ("vocab", "d_model", "layers", "heads", "context")
                 if shape[name] < 1]:
        raise ValueError(f"{', '.join(small)} must be at least 1, got "
                         f"{', '.join(str(shape[n]) for n in small)}")
    if shape["d_model"] % shape["heads"]:
        raise ValueError(f"d_model ({shape['d_model']}) must be a multiple of heads "
                         f"({shape['heads']})")
    if shape["vocab"] < 96:
        raise ValueError(f"vocab ({shape['vocab']}) must be at least the 96 characters of the "
                         f"text")
    experts, k = shape["experts"], shape["top_k"]
    if experts < 0 or (experts and not 1 <= k <= experts) or (not experts and k != 1):
        raise ValueError(f"experts must be 0 (a dense MLP) or more, and top_k between 1 and "
                         f"the experts (1 without experts), got experts = {experts}, top_k = {k}")
