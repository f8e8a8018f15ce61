"""Checks for lesson 12's exercises: a choice the planner lacks (recomputing only as many layers
as the memory needs), and a prediction of each pipeline stage's activations checked against a
run.

Korthikanti et al. 2022 (full, selective and partial recomputation); Narayanan et al. 2021
(1F1B keeps at most p - s micro-batches in flight on stage s). The planner recomputes all layers
or none and reports the busiest stage only; both answers are the exercise's, so their references
sit between solution markers and the student edition of the library leaves them out. Each check
is a probe (the student's kernel) and a judge (outside it): see :mod:`course_lib.exercises.common`.
The judges draw their cases themselves and take only the answers from the data (:mod:`.cases`).
"""

from __future__ import annotations

from dataclasses import replace

from course_lib import planner as P
from course_lib.exercises.cases import digest, merged
from course_lib.exercises.common import (
    ExerciseFailed,
    are_numbers,
    check_drawn,
    checked,
    hidden_seed,
    judge_cases,
    launch_checked,
)

# -- exercise 1: recompute as few layers as fit ------------------------------------------------


def fewest_layers_to_recompute(model: P.Transformer, plan: P.Plan, budget: float) -> int | None:
    """Reference: the fewest of the model's layers (a plan without pipelining) whose activations
    must be recomputed -- each keeps only its input, as with full recomputation -- for a GPU to
    fit in ``budget`` bytes (Megatron-LM's "block" recomputation); None if recomputing them all
    does not fit either. Recomputing k >= 1 layers saves k (full - kept) bytes, but while
    backward recomputes one of them its whole activations are back: k - 1 of them count."""
    ### BEGIN SOLUTION
    none = P.memory(model, replace(plan, recompute=False))["total"]
    if none <= budget:
        return 0
    full = P.activation_bytes_per_layer(model, replace(plan, recompute=False))
    kept = P.activation_bytes_per_layer(model, replace(plan, recompute=True))
    for k in range(1, model.layers + 1):
        if none - (k - 1) * (full - kept) <= budget:
            return k
    return None
    ### END SOLUTION


def block_recompute_bytes(model: P.Transformer, plan: P.Plan, k: int) -> float:
    """A GPU's predicted bytes with k of the layers recomputed (0 <= k <= layers, no pipeline),
    for the judge's explanations (the exercise asks the inverse, so this too is an answer)."""
    ### BEGIN SOLUTION
    without = P.memory(model, replace(plan, recompute=False))["total"]
    if k == 0:
        return without
    saved = (P.activation_bytes_per_layer(model, replace(plan, recompute=False))
             - P.activation_bytes_per_layer(model, replace(plan, recompute=True)))
    return without - (k - 1) * saved
    ### END SOLUTION


GPT_13B_LONG = P.Transformer(layers=40, hidden=5120, heads=40, seq=8192, vocab=51_200,
                             global_batch=256)


def _block_cases(seed):
    gib = 2**30
    gpt_7b = P.Transformer(layers=32, hidden=4096, heads=32, seq=2048, vocab=51_200,
                           global_batch=512)
    cases = [(GPT_13B_LONG, P.Plan(dp=4, tp=8, pp=1, zero=1, micro_batches=64), 80 * gib),
             (gpt_7b, P.Plan(dp=8, tp=1, pp=1, zero=3, micro_batches=16), 40 * gib),
             (gpt_7b, P.Plan(dp=8, tp=1, pp=1, zero=3, micro_batches=64, attention="flash"),
              80 * gib),
             (gpt_7b, P.Plan(dp=2, tp=4, pp=1, zero=0, micro_batches=1), 40 * gib)]
    if seed is not None:
        import random

        g = random.Random(seed + 1200)
        heads = g.choice([16, 24, 32])
        model = P.Transformer(layers=g.choice([12, 24, 36]), hidden=heads * 128, heads=heads,
                              seq=g.choice([2048, 4096]), vocab=32_000, global_batch=64)
        plan = P.Plan(dp=2, tp=g.choice([2, 4, 8]), pp=1, zero=g.choice([1, 2, 3]),
                      micro_batches=g.choice([1, 4]), attention=g.choice(["stored", "flash"]),
                      sequence_parallel=g.random() < 0.5)
        none, every = (P.memory(model, replace(plan, recompute=r))["total"]
                       for r in (False, True))
        cases.append((model, plan, every + g.random() * (none - every)))
    return cases


# the visible cases' answers by their digests: the student edition judges them without them
BLOCK_DIGESTS = (
    "2c624232cdd221771294dfbb310aca000a0df6ac8b66b696d90ef06fdefb64a3",
    "670671cd97404156226e507973f2ab8330d3022ca96e0c93bdbdb320c41adcaf",
    "5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9",
    "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b",
)


def _plain(model, plan, hidden=False, **extra):
    return dict(model=dict(model.__dict__), plan=plan.as_dict(), hidden=hidden, **extra)


def _probe_block(fn) -> dict:
    out = []
    for i, (model, plan, budget) in enumerate(_block_cases(hidden_seed())):
        value = fn(model, plan, budget)
        whole = value is None or (isinstance(value, int) and not isinstance(value, bool))
        out.append(dict(case=_plain(model, plan, hidden=i >= 4, budget=budget),
                        answer=value if whole else repr(value)))
    return dict(cases=out)


def _judge_block_case(item):
    model, plan = P.Transformer(**item["case"]["model"]), P.Plan(**item["case"]["plan"])
    budget, answer = item["case"]["budget"], item["answer"]
    right = fewest_layers_to_recompute(model, plan, budget)
    if answer == right:
        return None
    where = f"{model.layers} layers {model.hidden} wide, {plan}, {P.size(budget)}"
    if not (answer is None or isinstance(answer, int)) or (
            answer is not None and not 0 <= answer <= model.layers):
        return (f"for {where} the function returned {answer!r}: return a number of layers "
                f"from 0 to {model.layers}, or None if recomputing all does not fit")
    if answer is None:
        return f"for {where} recomputing {right} layers fits: None is for when none does"
    if right is None:
        return f"for {where} even recomputing every layer does not fit: return None"
    if answer > right:
        return f"for {where} {right} recomputed layers already fit: recompute as few as fit"
    need = block_recompute_bytes(model, plan, answer)
    hint = (" (while backward recomputes a layer, that layer's whole activations are back)"
            if answer == right - 1 else "")
    return (f"for {where}, with {answer} layers recomputed a GPU needs {P.size(need)}, more "
            f"than the budget{hint}")


def _judge_block(data) -> str:
    own = {"cases": [{"case": _plain(model, plan, hidden=i >= 4, budget=budget)}
                     for i, (model, plan, budget) in enumerate(_block_cases(hidden_seed()))]}
    cases = merged(own, data, ("answer",))["cases"]  # the cases drawn here
    try:
        judge_cases(cases, _judge_block_case)
    except NotImplementedError:  # the student edition: the visible answers by their digests
        for i, (item, right) in enumerate(zip(cases, BLOCK_DIGESTS, strict=False)):
            if digest(item["answer"]) != right:
                model, plan = item["case"]["model"], P.Plan(**item["case"]["plan"])
                where = (f"{model['layers']} layers {model['hidden']} wide, {plan}, "
                         f"{P.size(item['case']['budget'])}")
                raise ExerciseFailed(f"visible case {i + 1} ({where}): {item['answer']!r} is "
                                     f"not the fewest layers that fit") from None
        return (f"recorded: right on the {len(BLOCK_DIGESTS)} visible cases; the grader judges "
                f"hidden ones")
    return ("correct: each recomputed layer saves its activations but its input, and one of "
            "them is whole again while backward recomputes it")


check_block_recompute = checked("lesson12.block_recompute", _probe_block, _judge_block)
check_block_recompute.__doc__ = """Check ``fn(model, plan, budget)``: the fewest layers to
recompute for one GPU of ``plan`` (no pipeline) to fit in ``budget`` bytes, or None."""

# -- exercise 2: each pipeline stage's activations, predicted, then measured --------------------


def draw_pipeline(rng) -> dict:
    """Exercise 2's run: 2 stages, the micro-batch count and the context drawn.
    ``common.drawn("lesson12.pipeline", draw_pipeline)`` in the notebook."""
    return dict(micro_batches=int(rng.choice([2, 4, 8])), context=int(rng.choice([32, 48, 64])))


SHAPE = dict(vocab=96, d_model=64, layers=4, heads=4, global_batch=16)


def run_model(drawn: dict) -> P.Transformer:
    """The drawn run's model as the planner describes it (float32, its own head)."""
    return P.Transformer(layers=SHAPE["layers"], hidden=SHAPE["d_model"], heads=SHAPE["heads"],
                         seq=drawn["context"], vocab=SHAPE["vocab"],
                         global_batch=SHAPE["global_batch"], value_bytes=4, tied_head=False)


def stage_activation_bytes(model: P.Transformer, plan: P.Plan) -> list[float]:
    """Reference: the peak activation bytes of each pipeline stage of a TinyGPT under 1F1B
    (dp any, no recomputation): stage s keeps min(p - s, m) micro-batches of its layers; the
    last also keeps the head's (final norm in and out, its statistics, the log-softmax)."""
    ### BEGIN SOLUTION
    p, m = plan.pp, plan.micro_batches
    tokens = model.seq * P.micro_batch_size(model, plan)
    layer = P.tiny_gpt_bytes_per_layer(model, plan)
    head = tokens * (2 * model.hidden + 2 + model.vocab) * model.value_bytes
    return [model.layers // p * min(p - s, m) * layer + (head if s == p - 1 else 0.0)
            for s in range(p)]
    ### END SOLUTION


def _stage_cases(seed):
    if seed is None:
        return []
    import random

    g = random.Random(seed + 12)
    model = P.Transformer(layers=8, hidden=g.choice([32, 96]), heads=4, seq=g.choice([16, 40]),
                          vocab=96, global_batch=32, value_bytes=4, tied_head=False)
    return [(model, P.Plan(dp=1, tp=g.choice([1, 2]), pp=4, micro_batches=g.choice([2, 8]))),
            (model, P.Plan(dp=2, tp=1, pp=2, micro_batches=g.choice([1, 4])))]


def _measure(drawn):
    from course_lib import train_gpt

    return train_gpt.train(pp=2, micro_batches=drawn["micro_batches"], steps=1,
                           context=drawn["context"], **SHAPE)["activations"]


def _probe_stages(fn, drawn) -> dict:
    model = run_model(drawn)
    plan = P.Plan(dp=1, tp=1, pp=2, micro_batches=drawn["micro_batches"])
    predicted = fn(model, plan)
    measured = launch_checked(_measure, 2, (drawn,), timeout=120)
    hidden = [dict(case=_plain(m, p, hidden=True), answer=fn(m, p))
              for m, p in _stage_cases(hidden_seed())]
    return dict(drawn=drawn, predicted=predicted, measured=measured, hidden=hidden)


def _judge_stage_case(item):
    model, plan = P.Transformer(**item["case"]["model"]), P.Plan(**item["case"]["plan"])
    right = stage_activation_bytes(model, plan)
    if not are_numbers(item["answer"], plan.pp):
        return f"for {plan} return one number per stage ({plan.pp})"
    if any(abs(a - r) > 1e-9 * r for a, r in zip(item["answer"], right, strict=True)):
        return f"for {plan} some stage's bytes are wrong"
    return None


def _judge_stages(data) -> str:
    drawn, predicted, measured = data["drawn"], data["predicted"], data["measured"]
    check_drawn("lesson12.pipeline", draw_pipeline, drawn)  # graded runs only
    if not are_numbers(predicted, 2):
        raise ExerciseFailed(f"return a list of 2 numbers of bytes, one per stage, not "
                             f"{predicted!r}")
    off = [p / m - 1 for p, m in zip(predicted, measured, strict=True)]
    if max(abs(x) for x in off) > 0.02:
        worse = max(range(2), key=lambda s: abs(off[s]))
        hint = (" (which stage keeps the head's activations, and how many micro-batches does "
                "each stage hold at once under 1F1B?)")
        raise ExerciseFailed(f"stage {worse}'s prediction is {off[worse]:+.0%} off what the run "
                             f"kept{hint}")
    own = {"hidden": [{"case": _plain(m, p, hidden=True)}
                      for m, p in _stage_cases(hidden_seed())]}
    hidden = merged(own, {"hidden": data.get("hidden", [])}, ("answer",))["hidden"]
    judge_cases(hidden, _judge_stage_case)  # the hidden cases drawn here, not read
    return (f"correct: both stages within {max(abs(x) for x in off):.1%} of the run "
            f"(m = {drawn['micro_batches']}, context {drawn['context']})")


check_stages = checked("lesson12.stages", _probe_stages, _judge_stages)
check_stages.__doc__ = """Check ``fn(model, plan)``, each pipeline stage's peak activation bytes,
against a run of the drawn plan: ``check_stages(fn, drawn)``."""
