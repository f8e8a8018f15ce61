"""Checks for lesson 2's exercises: what local steps are worth in rounds of communication (a
count read off this run), and a decentralized step that adapts before it combines.

Lecture note "Parallel computing for empirical risk minimization", sections 4.1 (FedAvg) and
4.2 (decentralized optimisation on a graph). Each check is a probe and a judge
(:mod:`course_lib.exercises.common`); the step's judge draws its cases itself (:mod:`.cases`).

The library simulates FedAvg and decentralized gradient descent, DGD (``erm_simulators``), so the
first exercise asks for a number only a run gives (q and the round count drawn for each run; the
judge computes the run's curve again), the second for adapt-then-combine with a mixing matrix.
"""

from __future__ import annotations

import torch

from course_lib.data import shard_rows
from course_lib.decentralized import mixing_matrix
from course_lib.erm import breast_cancer_problem, diabetes_problem
from course_lib.erm_simulators import SEVEN_NODE_GRAPH, fedavg_losses
from course_lib.exercises import practice
from course_lib.exercises.cases import merged, projections
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    check_drawn,
    checked,
    grading_seed,
    hidden_seed,
    is_whole,
)

MAX_ROUNDS = 20_000  # more than GD needs for any target of the lesson's curves


# -- Exercise 1: rounds of plain gradient descent that q local steps are worth ------------------

# A graded run draws q and AFTER in these ranges (41 to 143 rounds), others a practice draw; q >=
# 4, AFTER >= 8 keep "q x AFTER" wrong; q x AFTER <= 160 local steps keep it fast.
Q_RANGE, AFTER_RANGE = (4, 8), (8, 20)
LESSON_LR, LESSON_CLIENTS = 0.1, 4  # the notebook's FED_LR and clients (the practice cases')


@practice.practised
def draw_q_after(rng) -> tuple[int, int]:
    """Exercise 1's (Q, AFTER): ``common.drawn("lesson02.q_after", draw_q_after)`` in the
    notebook (a practice draw; the grader's run draws its own)."""
    return tuple(int(rng.integers(lo, hi + 1)) for lo, hi in (Q_RANGE, AFTER_RANGE))


def _probe_rounds(rounds, q_losses, q, lr, after) -> dict:
    """The student's count ``rounds``, and the run's FedAvg curve with ``q`` local steps."""
    if isinstance(q_losses, dict) or not hasattr(q_losses, "__len__") or not len(q_losses):
        raise ExerciseFailed("pass q_losses, the list of objectives of FedAvg with q local steps "
                             "(one per round), drawn and computed in the exercise's first cell")
    return {"answer": rounds, "q": int(q), "curve": [float(v) for v in q_losses],
            "lr": float(lr), "after": int(after)}


def _gd_losses_until(target: float, lr: float) -> list[float]:
    """Objective after each round of full-batch gradient descent on the diabetes data from
    w = 0, until it is at or below ``target`` (FedAvg with q = 1 is this, computed here with the
    whole gradient instead of the clients' weighted sum: an independent reference). The student
    edition of the library leaves this out: it is the exercise's answer."""
    ### BEGIN SOLUTION
    problem = diabetes_problem()
    w = torch.zeros(problem.d, dtype=torch.float64)
    losses = []
    while len(losses) < MAX_ROUNDS and (not losses or losses[-1] > target):
        w = w - lr * problem.gradient(w)
        losses.append(problem.loss(w))
    return losses
    ### END SOLUTION


def _judge_rounds(data) -> str:
    """Recount: the target is the run's q-curve after ``after`` rounds, the count GD's."""
    check_drawn("lesson02.q_after", draw_q_after, [data["q"], data["after"]])
    if grading_seed() is not None and data["lr"] != LESSON_LR:  # lr = 0: every count is 1
        raise ExerciseFailed(f"pass the notebook's learning rate, FED_LR = {LESSON_LR}")
    answer, curve, after, q = data["answer"], data["curve"], data["after"], data["q"]
    if not is_whole(answer):
        raise ExerciseFailed(f"give the number of rounds as a whole number, not {answer!r}")
    if not 1 <= after <= len(curve) or q < 2:
        raise ExerciseFailed(f"pass this run's q_losses, q and AFTER (a curve with q > 1 local "
                             f"steps and at least {after} rounds)")
    target, problem = curve[after - 1], diabetes_problem()  # the run's curve, computed again:
    again = fedavg_losses(problem, shard_rows(problem.n, LESSON_CLIENTS), q, data["lr"], after)
    if not abs(again[-1] - target) <= 1e-9 * abs(again[-1]):  # made-up curves are not judged
        raise ExerciseFailed(f"q_losses[AFTER - 1] = {target:.8g} is not what FedAvg with q = {q} "
                             f"reaches after {after} rounds ({again[-1]:.8g}): pass the q_losses "
                             f"the exercise's first cell computed")
    try:
        gd = _gd_losses_until(target, data["lr"])
    except NotImplementedError:  # the student edition: the practice draw's digests
        return practice.judge("lesson02.q_after", [q, after, data["lr"]], {"rounds": int(answer)})
    if gd[-1] > target:
        raise ExerciseFailed(f"even {MAX_ROUNDS} rounds of q = 1 stay above {target:.6g}: pass "
                             f"this run's losses and learning rate")
    right, answer = len(gd), int(answer)
    at = lambda r: gd[r - 1] if r <= len(gd) else gd[-1]  # noqa: E731  GD's objective after r
    # exact, up to a tie at the threshold that rounding alone could decide
    if answer == right or (abs(answer - right) == 1 and 1 <= answer
                           and abs(at(answer) - target) <= 1e-12 * abs(target)):
        return (f"correct: {q} local steps per round for {after} rounds are worth {right} rounds "
                f"of gradient descent, {right / after:.2f} rounds each")
    if answer < right:
        got = f"{at(answer):.8g}" if answer >= 1 else "the starting objective"
        raise ExerciseFailed(f"after {answer} rounds of q = 1 the objective is {got}, still "
                             f"above {target:.8g}, what q = {q} reaches after {after} rounds: "
                             f"run q = 1 for more rounds")
    naive = (f" ({answer} = q x AFTER is the guess that {q} local steps are worth {q} rounds: "
             f"run q = 1 and count)") if answer == q * after else ""
    raise ExerciseFailed(f"q = 1 is already at or below {target:.8g} (what q = {q} reaches after "
                         f"{after} rounds) before round {answer}: count the first round that gets "
                         f"there{naive}")


def _practice_answers(case) -> dict:
    """A practice case's count: its q-curve, then gradient descent until it gets as low."""
    (q, after, lr), problem = case, diabetes_problem()
    curve = fedavg_losses(problem, shard_rows(problem.n, LESSON_CLIENTS), q, lr, after)
    return {"rounds": [len(_gd_losses_until(curve[-1], lr))]}


practice.register("lesson02.q_after", _practice_answers, draw_q_after, [LESSON_LR])
check_rounds_to_match = checked("lesson02.rounds_to_match", _probe_rounds, _judge_rounds)
check_rounds_to_match.__doc__ = """Check the number of rounds of FedAvg with q = 1 (plain
gradient descent) needed to reach the objective FedAvg with ``q`` local steps reaches after
``after`` rounds: ``check_rounds_to_match(rounds, q_losses, q, lr, after)``, with ``q_losses``
the run's objective after each round of the q-step FedAvg."""


# -- Exercise 2: adapt, then combine -------------------------------------------------------------


def _random_case(g: torch.Generator) -> dict:
    """A graded run's own case: a random node count, sparse row-stochastic W, problem, lr."""
    nodes = int(torch.randint(3, 9, (1,), generator=g))
    links = (torch.rand(nodes, nodes, generator=g) < 0.5) | torch.eye(nodes, dtype=torch.bool)
    W = torch.rand(nodes, nodes, generator=g, dtype=torch.float64) * links
    return {"problem": ["diabetes", "breast cancer"][int(torch.randint(2, (1,), generator=g))],
            "nodes": nodes, "W": W / W.sum(dim=1, keepdim=True),
            "lr": float(torch.empty(1, dtype=torch.float64).uniform_(0.01, 0.5, generator=g)),
            "seed": int(torch.randint(1000, (1,), generator=g))}


def _cases(seed) -> dict:
    """Visible: the seven-node graph with the note's equal weights (not symmetric) and with
    lr = 0 (pure averaging, checked first), and a five-node tree with Metropolis weights on the
    logistic problem. A graded run adds random graphs, weights and steps."""
    tree = {0: [1, 2, 3], 1: [0], 2: [0, 4], 3: [0], 4: [2]}  # degrees 1 to 3: weights differ
    equal = mixing_matrix(SEVEN_NODE_GRAPH, "equal")
    cases = {"visible": [
        {"problem": "diabetes", "nodes": 7, "W": equal, "lr": 0.0, "seed": 0},
        {"problem": "diabetes", "nodes": 7, "W": equal, "lr": 0.05, "seed": 1},
        {"problem": "breast cancer", "nodes": 5, "W": mixing_matrix(tree, "metropolis"),
         "lr": 0.5, "seed": 2}]}
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        cases["hidden"] = [_random_case(g) for _ in range(3)]
    return cases


def _problem(name: str):
    return {"diabetes": diabetes_problem, "breast cancer": breast_cancer_problem}[name]()


def _inputs(seed) -> dict:
    """Each case's problem (by name), nodes' rows, parameters, W and lr, by group."""
    inputs = {}
    for kind, cases in _cases(seed).items():
        inputs[kind] = []
        for case in cases:
            problem = _problem(case["problem"])
            g = torch.Generator().manual_seed(case["seed"])
            inputs[kind].append({
                "problem": case["problem"], "W": case["W"], "lr": case["lr"],
                "params": torch.randn(case["nodes"], problem.d, generator=g, dtype=torch.float64),
                "rows": shard_rows(problem.n, case["nodes"], case["seed"])})
    return inputs


def _probe_atc(atc_step) -> dict:
    data = {}
    for kind, cases in _inputs(hidden_seed()).items():
        data[kind] = []
        for case in cases:
            problem, params, rows = _problem(case["problem"]), case["params"], case["rows"]
            nodes = len(params)
            got = atc_step(problem, [x.clone() for x in params], [r.clone() for r in rows],
                           case["W"].clone(), case["lr"])
            if got is None:
                raise ExerciseFailed("atc_step returned None: return the list of new vectors")
            try:
                got = torch.stack([torch.as_tensor(x) for x in got]).double()
            except (TypeError, RuntimeError) as error:
                raise ExerciseFailed(f"return one vector of {problem.d} numbers per node "
                                     f"({error})") from None
            if got.shape != params.shape:
                raise ExerciseFailed(f"with {nodes} nodes and d = {problem.d}, return {nodes} "
                                     f"vectors of {problem.d} numbers, not shape "
                                     f"{tuple(got.shape)}")
            data[kind].append(dict(case, got=got))
    return data


def _local_gradients(problem, params, rows, *, mean=True) -> torch.Tensor:
    """Each node's gradient of its own objective at its own parameters, by autograd (not the
    library's closed form): mean loss over its rows plus the l2 term."""
    grads = []
    for x, r in zip(params, rows, strict=True):
        x = x.clone().requires_grad_(True)
        margin = problem.X[r] @ x
        if problem.kind == "logistic":
            loss = torch.nn.functional.softplus(-problem.y[r] * margin)
        else:
            loss = 0.5 * (margin - problem.y[r]) ** 2
        total = (loss.mean() if mean else loss.sum()) + 0.5 * problem.lam * x @ x
        grads.append(torch.autograd.grad(total, x)[0])
    return torch.stack(grads)


def _judge_one(case) -> str | None:
    """What is wrong with one step, or None."""
    problem = _problem(case["problem"])
    X, W, lr, got = case["params"], case["W"], case["lr"], case["got"]
    if not isinstance(got, torch.Tensor) or got.shape != X.shape:
        return f"return {len(X)} vectors of {problem.d} numbers"
    # the reference, and the wrong orders it explains: the student edition leaves them out
    ### BEGIN SOLUTION
    G = _local_gradients(problem, X, case["rows"])
    right = W @ (X - lr * G)

    def same(a):
        return torch.allclose(got, a, rtol=1e-9, atol=1e-9)

    if same(right):
        return None
    if lr == 0 and same(W.T @ X):
        return ("pure averaging (lr = 0) is wrong: you weighed with W's columns; node i's new "
                "vector is sum_j W[i, j] x_j (row i of W)")
    if lr == 0:
        worst = int((got - right).abs().amax(dim=1).argmax())
        return (f"pure averaging (lr = 0) is wrong at node {worst}: off by "
                f"{(got - right)[worst].abs().max().item():.3g}; node i's new vector is "
                f"sum_j W[i, j] x_j")
    if same(W @ X - lr * G):
        return ("that is the library's DGD step (average, then step along the gradient at the "
                "old vector): adapt first, x_j - lr g_j(x_j) at every node, then combine those "
                "with W")
    if same(W.T @ (X - lr * G)):
        return "the combination uses W's columns: node i takes sum_j W[i, j] y_j (row i of W)"
    if same(W @ (X - lr * (G - problem.lam * X))):
        return "the gradient lacks the regulariser's lam x term"
    mean_free = _local_gradients(problem, X, case["rows"], mean=False)
    if same(W @ (X - lr * mean_free)):
        return ("the gradient is the sum over the node's rows: divide it by the node's number "
                "of rows (its own objective is a mean)")
    worst = int((got - right).abs().amax(dim=1).argmax())
    return (f"with lr = {lr:g}, node {worst} is off by "
            f"{(got - right)[worst].abs().max().item():.3g}: each node first steps "
            f"y_j = x_j - lr g_j(x_j) along its own gradient, then takes sum_j W[i, j] y_j")
    ### END SOLUTION


# the visible cases' right steps as cases.projections (a test holds them to the reference):
# the student edition, which lacks the reference, judges the visible cases with them
VISIBLE_STEPS = [[4.358919166765535, 0.7847691061680733, 0.9206493586728777],
                 [-9.611698731098944, 5.15125778375062, 10.582157118783027],
                 [6.557252766937195, -4.7218138037074855, -3.231682550743751]]


def _judge_visible(case, expected) -> str | None:
    try:
        return _judge_one(case)
    except NotImplementedError:  # the student edition
        got = torch.as_tensor(projections(case["got"]))
        if torch.allclose(got, torch.as_tensor(expected), rtol=1e-7, atol=1e-9):
            return None
        return ("the new vectors are not adapt-then-combine's: each node steps y_j = x_j - lr "
                "g_j(x_j) along its own gradient, then takes sum_j W[i, j] y_j")


def _judge_atc(data) -> str:
    data = merged(_inputs(hidden_seed()), data, ("got",))  # the cases drawn here, not read
    for case, expected in zip(data["visible"], VISIBLE_STEPS, strict=True):
        wrong = _judge_visible(case, expected)
        if wrong:
            raise ExerciseFailed(f"{case['problem']}, {len(case['W'])} nodes: {wrong}")
    if any(_judge_one(case) for case in data.get("hidden", [])):
        raise HiddenTestFailed("a hidden case failed")
    return (f"correct: adapt-then-combine matches on {len(data['visible'])} cases (pure "
            f"averaging, equal weights, Metropolis weights on the logistic problem)")


check_atc_step = checked("lesson02.atc_step", _probe_atc, _judge_atc)
check_atc_step.__doc__ = """Check ``atc_step(problem, params, client_rows, W, lr)``: every node
steps along its own gradient, then takes the W-weighted combination of its neighbours' stepped
vectors; returns the list of new vectors."""
