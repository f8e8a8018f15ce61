"""The student edition of the library gives no exercise's answer away (issue: judge helpers that
shipped gave answers away, e.g. lesson07._neighbours, the two fp16 values around x, the hard
part of its stochastic rounding).

Every judge helper, or judge path, that computes an exercise's answer -- a reference a student
could call or copy instead of solving it -- sits in a solution region of its lesson module, which
``editions.student_library`` cuts out. The student's copy of each lesson module still imports, and
there a check whose judge needs the missing piece still judges the cases the student sees: from
their expected values' fingerprints or digests, shipped for those cases only (for a drawn
exercise, for each practice draw: course_lib.exercises.practice). The instructor's library judges
them as before, and the grader the hidden cases and its own draws.
"""

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import course_lib
from course_lib.exercises import common, editions
from course_lib.exercises.verdicts import MODE

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = Path(course_lib.__file__).resolve().parent
LESSONS = sorted(p.stem for p in (LIBRARY / "exercises").glob("lesson[0-9][0-9]*.py"))

# (lesson module, function, a line of it that computes the answer: not in the student's copy)
PIECES = [
    # lesson 0, exercise 2 (predict what each rank holds): the prediction itself
    ("lesson00", "_simulate", "held = [max(values)] * p"),
    # lesson 1, exercise 3 (multiply-adds forward and backward): both counts
    ("lesson01", "count_macs", "with FlopCounterMode(display=False) as backward:"),
    # lesson 2, exercise 1 (rounds of q = 1 to match q local steps): the count
    ("lesson02", "_gd_losses_until", "w = w - lr * problem.gradient(w)"),
    # lesson 2, exercise 2 (adapt, then combine): the step, and the wrong orders it names
    ("lesson02", "_judge_one", "right = W @ (X - lr * G)"),
    # lesson 3, exercise 2 (where the ring overtakes recursive doubling): the crossing
    ("lesson03", "_costs", "return math.log2(p) * (alpha + beta * n)"),
    # lesson 4, exercise 2 (what each scaled epoch was worth): the interpolated epoch
    ("lesson04", "worth", "out.append(k + (base[k - 1] - target) / (base[k - 1] - base[k]))"),
    # lesson 6, exercise 1 (staleness with q slow workers): mean_staleness's very signature
    ("lesson06", "simulated_staleness",
     "pad = {w: (k if w > m - q else 1.0) for w in range(1, m + 1)}"),
    # lesson 6, exercise 2 (gradients per second in each mode): the simulated run's rate
    ("lesson06", "simulated_rate", 'return len(log["staleness"]) / log["time"][-1]'),
    # lesson 6b, exercise 2 (gossip steps to agree): the largest |eigenvalue| off consensus
    ("lesson06b", "steps_to_agree", "lam = torch.linalg.matrix_norm(W.double() - 1.0 / n, ord=2)"),
    # lesson 7, exercise 2 (stochastic rounding to fp16): the two fp16 values around x
    ("lesson07", "_neighbours",
     "lo = np.where(h.astype(np.float64) > x, np.nextafter(h, np.float16(-np.inf)), h)"),
    # lesson 7b, exercise 1 (EF-signSGD's compressor on ranks): the message, and exercise 2's bytes
    ("lesson07b", "ef_sign_reference",
     "sign = torch.where(corrected >= 0, 1.0, -1.0).to(corrected.dtype)"),
    ("lesson07b", "bytes_of_message", "return math.ceil(n * bits / 8) + 4 * scales"),
    # lesson 8, exercise 2 (what uniform weights train on): the distance, and "off by" it
    ("lesson08", "uniform_mix_distance", "weight[part] = 1 / (len(parts) * len(part))"),
    ("lesson08", "_judge_uniform_mix", "That is sum_c |q(c) - p(c)|"),
    # lesson 9, exercise 2 (attackers a round held): the count of rounds, the tolerances
    ("lesson09", "_attackers_per_round",
     "out += [len(attackers & set(fl.sample_clients(CLIENTS, m / CLIENTS, s, r)))"),
    ("lesson09", "_tolerated", "rule_fn(torch.tensor([[bad]] * b + [[honest]] * (m - b))) < 1)"),
    ("lesson09", "_judge_breakdown", "you also counted rounds with exactly"),
    # stripped before: lessons 10 to 12's references
    ("lesson10", "exposed_per_message",
     "under = sum(max(0.0, min(end, e) - max(start, b)) for b, e in backward)"),
    ("lesson11", "overhead_fit", "c = {m: m * v + p - 1 for m in walls}"),
    ("lesson12", "fewest_layers_to_recompute", "if none - (k - 1) * (full - kept) <= budget:"),
    ("lesson12", "block_recompute_bytes", "return without - (k - 1) * saved"),
    ("lesson12", "lightest_busiest_stage",
     "best = [prefix[j] for j in range(n + 1)]  # one stage holds units 0..j-1"),
    ("lesson12b", "share_in_order", "right += 1.0 if same > 0 else 0.5 if same == 0 else 0.0"),
    ("lesson12b", "stage_activation_bytes",
     "head = tokens * (2 * model.hidden + 2 + model.vocab) * model.value_bytes"),
    # lesson 13, exercise 2 (the assignments a capacity drops): the near-miss counts it names
    ("lesson13", "_capacity_hint", "floor = max(1, math.floor(factor * TOKENS * k / EXPERTS))"),
]


@pytest.fixture(scope="module")
def student(tmp_path_factory) -> Path:
    """The folder that holds the student edition's ``course_lib``."""
    root = tmp_path_factory.mktemp("student")
    editions.student_library(LIBRARY, root / "course_lib")
    return root


def _function(source: str, name: str) -> str:
    """The source of function ``name``, with the end of a solution region that closes it."""
    found = [node for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.FunctionDef) and node.name == name]
    assert len(found) == 1, f"{name}: {len(found)} definitions"
    lines, end = source.splitlines(keepends=True), found[0].end_lineno
    while end < len(lines) and lines[end].strip().startswith("### END SOLUTION"):
        end += 1
    return "".join(lines[found[0].lineno - 1:end])


@pytest.mark.parametrize(("module", "name", "secret"), PIECES,
                         ids=[f"{module}.{name}" for module, name, _ in PIECES])
def test_the_student_edition_leaves_the_answer_out(student, module, name, secret):
    ours = (LIBRARY / "exercises" / f"{module}.py").read_text()
    theirs = (student / "course_lib" / "exercises" / f"{module}.py").read_text()
    fenced = "".join(m.group(0) for m in editions.SOLUTION.finditer(_function(ours, name)))
    assert secret in fenced, f"{module}.{name}: the line is not in a solution region"
    assert secret not in theirs, f"{module}.{name} ships: {secret}"
    assert common.LIBRARY_HAS_IT in _function(theirs, name)  # the region became a raise


@pytest.mark.parametrize("lesson", LESSONS)
def test_each_lesson_module_of_the_student_edition_imports(student, lesson):
    done = subprocess.run(
        [sys.executable, "-c", f"import course_lib.exercises.{lesson} as m; print(m.__file__)"],
        cwd=student, env={**os.environ, "PYTHONPATH": str(student)}, capture_output=True,
        text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip()) == student / "course_lib" / "exercises" / f"{lesson}.py"


# Right answers to the exercises whose judges lost a piece, checked as a notebook would
# (without boxes: the verdict is returned). Prints {piece: verdict} as JSON.
RIGHT_ANSWERS = textwrap.dedent("""
    import json

    import numpy as np
    import torch
    import torch.distributed as dist

    from course_lib import erm_simulators as sim
    from course_lib import federated as fl
    from course_lib import fl_security as sec
    from course_lib import partitions as pt
    from course_lib.data import load_digits, shard_rows
    from course_lib.erm import diabetes_problem
    from course_lib.exercises import (lesson00, lesson01, lesson02, lesson03, lesson04,
                                      lesson06, lesson06b, lesson07, lesson07b, lesson08,
                                      lesson09, practice)

    def practice_draw(name, draw):  # what a run outside the grader draws: a practice draw
        return practice.draws(name, draw)[3]

    verdicts = {}

    def verdict(piece, check, *args):
        try:
            verdicts[piece] = check(*args)
        except Exception as error:
            verdicts[piece] = f"raised {type(error).__name__}: {error}"

    def collective_sequence(values):  # lesson 0's
        rank, p = dist.get_rank(), dist.get_world_size()
        t = torch.tensor([values[rank]], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        t *= rank + 1
        everyone = [torch.zeros_like(t) for _ in range(p)]
        dist.all_gather(everyone, t)
        return (torch.cat(everyone).sum() - values[rank]).item()

    verdict("lesson00._simulate", lesson00.check_prediction, [6.0, 11.0], collective_sequence,
            [3.0, -2.0])

    C, H, B = practice_draw("lesson01.cost_sizes", lesson01.draw_cost_sizes)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, C, 3, 1, 1), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(64 * C, H), torch.nn.Tanh(),
                              torch.nn.Linear(H, 10))
    conv, fc = C * 64 * 9, H * 64 * C + 10 * H
    verdict("lesson01.count_macs", lesson01.check_backward_cost, B * (conv + fc),
            B * (conv + 2 * fc), net, B, (1, 8, 8))

    problem, (q, after) = diabetes_problem(), practice_draw("lesson02.q_after",
                                                           lesson02.draw_q_after)
    clients, losses = shard_rows(problem.n, 4), []
    w = torch.zeros(problem.d, dtype=torch.float64)
    for _ in range(after):
        w = sim.fedavg_round(problem, w, clients, q, 0.1)
        losses.append(problem.loss(w))
    w, rounds = torch.zeros(problem.d, dtype=torch.float64), 0
    while True:
        w, rounds = sim.fedavg_round(problem, w, clients, 1, 0.1), rounds + 1
        if problem.loss(w) <= losses[after - 1]:
            break
    verdict("lesson02._gd_losses_until", lesson02.check_rounds_to_match, rounds, losses, q, 0.1,
            after)

    def atc_step(problem, params, client_rows, W, lr):
        return list(W @ torch.stack([x - lr * sim.local_gradient(problem, r, x)
                                     for x, r in zip(params, client_rows)]))

    verdict("lesson02._judge_one", lesson02.check_atc_step, atc_step)

    alpha, beta, p = 0.215e-3, 1 / 0.55e9, 8
    steps = p.bit_length() - 1
    n_cross = (2 * (p - 1) - steps) * alpha / ((steps - 2 * (p - 1) / p) * beta)
    verdict("lesson03._judge_crossover", lesson03.check_crossover_size, n_cross, alpha, beta, p)

    def runs(*curves):
        return [{"step": list(range(1, len(c) + 1)), "loss": list(c)} for c in curves]

    seeded = {"batch 32, lr 0.05 (base)": runs([1.0, 0.6, 0.4, 0.1], [0.8, 0.4, 0.2, 0.3]),
              "batch 256, lr 0.4 (scaled x8)": runs([1.5, 1.0, 0.6, 0.3], [1.5, 1.0, 0.6, 0.4])}
    def epochs_worth(base, scaled):
        out = []
        for target in scaled:
            k = next((k for k, loss in enumerate(base) if loss <= target), None)
            out.append(None if k is None else 1.0 if k == 0 else
                       k + (base[k - 1] - target) / (base[k - 1] - base[k]))
        return out

    verdict("lesson04.worth", lesson04.check_epochs_worth, epochs_worth, seeded)

    verdict("lesson06.simulated_staleness", lesson06.check_mean_staleness,
            lambda m, q, k: ((m - q - 1) + q / k, (m - q) * k + (q - 1)))
    verdict("lesson06.simulated_rate", lesson06.check_rates,
            lambda mode, c, s: sum(1 / x for x in c) if mode == "async" else len(c) / max(c))

    def gossip_steps(W, eps):
        lam = torch.linalg.matrix_norm(W - 1.0 / len(W), ord=2).item()
        if lam > 1 - 1e-9:
            return None
        return 1 if lam < 1e-12 else int(np.ceil(np.log(eps) / np.log(lam)))

    verdict("lesson06b.steps_to_agree", lesson06b.check_gossip_steps, gossip_steps)

    def fp16_round(x, generator):
        near = x.half()
        below = torch.where(near.double() > x,
                            torch.nextafter(near, torch.tensor(-float("inf"), dtype=near.dtype)),
                            near)
        above = torch.nextafter(below, torch.tensor(float("inf"), dtype=below.dtype))
        above = torch.where(below.double() == x, below, above)
        gap = (above.double() - below.double()).clamp(min=torch.finfo(torch.float64).tiny)
        up = torch.rand(x.shape, generator=generator, dtype=x.dtype) * gap < x - below.double()
        return torch.where(up, above, below).double()

    verdict("lesson07._neighbours", lesson07.check_fp16_stochastic_round, fp16_round)

    def ef_sign_all_reduce(grad, residual, group=None):
        corrected = grad + residual
        message = corrected.abs().mean() * torch.where(corrected >= 0, 1.0, -1.0).double()
        mean = message.clone()
        dist.all_reduce(mean, group=group)
        return mean / dist.get_world_size(group), corrected - message

    verdict("lesson07b.ef_sign_reference", lesson07b.check_ef_sign, ef_sign_all_reduce)
    verdict("lesson07b.bytes_of_message", lesson07b.check_message_bytes,
            lambda s, b, g: -(-sum(s) * b // 8) + 4 * (len(s) if g is None else -(-sum(s) // g)))

    labels = load_digits().y_train.numpy()
    alpha, seed = practice_draw("lesson08.partition", lesson08.draw_partition)
    counts = pt.label_counts(labels, pt.dirichlet_per_class(labels, 50, alpha=alpha, min_size=5,
                                                            seed=seed)).astype(float)
    mix = (counts / counts.sum(axis=1, keepdims=True)).mean(axis=0)
    tv = 0.5 * np.abs(mix - counts.sum(axis=0) / counts.sum()).sum()
    verdict("lesson08._judge_uniform_mix", lesson08.check_uniform_mix, tv, labels, 50, alpha, seed)

    m, trim, share, attack_seed = practice_draw("lesson09.federation", lesson09.draw_federation)
    rounds, seeds = 12, (0, 1, 2)
    drawn = []
    for s in seeds:
        attackers = set(sec.fraction_attackers(range(20), share, seed=s + attack_seed))
        drawn += [len(attackers & set(fl.sample_clients(20, m / 20, s, r)))
                  for r in range(rounds)]
    tolerated = {"trimmed mean": int(trim * m), "median": (m - 1) // 2}
    breakdown = {name: [b, sum(a > b for a in drawn)] for name, b in tolerated.items()}
    verdict("lesson09._judge_breakdown", lesson09.check_breakdown, breakdown, m, trim, share,
            attack_seed, rounds, seeds)

    print(json.dumps(verdicts))
""")
JUDGED = {"lesson00._simulate", "lesson01.count_macs", "lesson02._gd_losses_until",
          "lesson02._judge_one", "lesson03._judge_crossover", "lesson04.worth",
          "lesson06.simulated_staleness", "lesson06.simulated_rate",
          "lesson06b.steps_to_agree", "lesson07._neighbours", "lesson07b.ef_sign_reference",
          "lesson07b.bytes_of_message", "lesson08._judge_uniform_mix",
          "lesson09._judge_breakdown"}  # lesson09._attackers_per_round: in _judge_breakdown


def _verdicts(root: Path) -> dict:
    graded = (common.GRADING_OUT, common.GRADED, common.GRADING_SEED, common.HIDDEN_SEED)
    env = {k: v for k, v in os.environ.items() if k not in graded}  # not a graded run
    done = subprocess.run([sys.executable, "-c", RIGHT_ANSWERS], cwd=root,
                          env={**env, "PYTHONPATH": str(root), MODE: "raise"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(verdicts) == JUDGED
    return verdicts


def test_in_the_student_edition_every_such_check_judges_the_visible_cases(student):
    """Each check whose judge lost a piece still tells right from wrong on the cases a student
    sees: their expected values ship for those cases only, or their digests for each practice
    draw (exercises.practice); lesson 0's prediction is held to the run."""
    for piece, verdict in _verdicts(student).items():
        assert verdict.startswith("correct"), (piece, verdict)


def test_the_instructors_library_judges_the_same_answers_right():
    for piece, verdict in _verdicts(ROOT).items():
        assert verdict.startswith("correct"), (piece, verdict)
