"""Checks for exercise cells: say what is wrong, rank by rank, instead of a bare assert.

Lecture: all of them; an exercise that launches workers checks what each rank ended with.
"""

from __future__ import annotations

import torch


class ExerciseFailed(AssertionError):
    """An exercise's answer is wrong; the message says how."""


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=1e-6)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def check_rank_results(results, expected, what: str = "the result", *,
                       per_rank: bool = False) -> str:
    """Compare what each rank returned with what it should have returned.

    ``expected`` is the value every rank should hold, or with ``per_rank=True`` a list with one
    value per rank. Raises :class:`ExerciseFailed` naming each rank that is wrong; returns a
    short confirmation.
    """
    if not isinstance(results, (list, tuple)):
        raise ExerciseFailed(f"expected the list launch() returns (one entry per rank), got "
                             f"{type(results).__name__}")
    wanted = list(expected) if per_rank else [expected] * len(results)
    if len(wanted) != len(results):
        raise ExerciseFailed(f"{len(results)} ranks returned results, but {len(wanted)} were "
                             f"expected: did you launch with the right world_size?")
    wrong = [f"rank {r} ended with {got!r} but {what} is {want!r}"
             for r, (got, want) in enumerate(zip(results, wanted, strict=True))
             if not _same(got, want)]
    if wrong:
        raise ExerciseFailed("; ".join(wrong))
    return f"correct: all {len(results)} ranks hold {what}"


def check_gradient(name: str, got, expected, *, tol: float = 1e-8, case: str = "") -> str:
    """Compare a student's gradient with the right one; say how it is wrong.

    Names a missing return, a wrong shape (with the shape it should have), or the largest
    difference and where it is. ``case`` describes the input (e.g. "batch 1, stride 2").
    """
    where = f" for {case}" if case else ""
    if got is None:
        raise ExerciseFailed(f"{name} is None{where}: did the function forget to return it?")
    got = torch.as_tensor(got)
    if got.shape != expected.shape:
        raise ExerciseFailed(f"{name} has shape {tuple(got.shape)}{where} but must have the "
                             f"shape of what it differentiates, {tuple(expected.shape)}")
    diff = torch.nan_to_num((got.double() - expected.double()).abs(), nan=float("inf"))
    worst = diff.max().item() if diff.numel() else 0.0
    if worst > tol:
        flat = int(diff.argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
        raise ExerciseFailed(
            f"{name} is wrong{where}: largest difference {worst:.3g} at index {index} "
            f"(yours {got.reshape(-1)[flat].item():.6g}, right "
            f"{expected.reshape(-1)[flat].item():.6g})")
    return f"{name}: correct{where} (largest difference {worst:.1e})"


def _small_federation():
    from course_lib.erm import diabetes_problem

    problem = diabetes_problem()
    sizes = [40, 120, 90, 192]  # unequal on purpose: the weights matter
    return problem, list(torch.arange(problem.n).split(sizes))


def check_fedavg_round(fedavg_round) -> str:
    """Check a student's ``fedavg_round(problem, w, client_rows, q, lr)`` against the reference
    simulator on clients of unequal size, for q = 1 and q = 5."""
    from course_lib import erm_simulators as sim

    problem, rows = _small_federation()
    w = torch.linspace(-0.5, 0.5, problem.d, dtype=torch.float64)
    for q in (1, 5):
        got = fedavg_round(problem, w.clone(), rows, q, 0.1)
        want = sim.fedavg_round(problem, w, rows, q, 0.1)
        if got is None:
            raise ExerciseFailed("fedavg_round returned None: return the new global model")
        got = torch.as_tensor(got)
        if got.shape != want.shape:
            raise ExerciseFailed(f"the new model has shape {tuple(got.shape)}, but w has "
                                 f"{tuple(want.shape)}")
        if not torch.allclose(got, want, atol=1e-10):
            unweighted = w - torch.stack([w - _local_steps(sim, problem, r, w, q, 0.1)
                                          for r in rows]).mean(dim=0)
            hint = (" It equals the plain mean of the clients' models: weight each client by its "
                    "number of samples n_k / n." if torch.allclose(got, unweighted, atol=1e-10)
                    else " Each client takes q steps from the same w on its own rows only.")
            raise ExerciseFailed(f"with q = {q}, the new model differs from the right one by "
                                 f"{(got - want).abs().max().item():.3g} (largest entry).{hint}")
    return "correct: FedAvg matches the reference for q = 1 (one GD step) and q = 5"


def _local_steps(sim, problem, rows, w, q, lr):
    w_k = w.clone()
    for _ in range(q):
        w_k = w_k - lr * sim.local_gradient(problem, rows, w_k)
    return w_k


def check_decentralized_step(decentralized_step) -> str:
    """Check ``decentralized_step(problem, params, client_rows, graph, lr)`` on the seven-node
    graph: equal to the reference, and with lr = 0 pure averaging that never leaves the range
    of the nodes' values."""
    from course_lib import erm_simulators as sim
    from course_lib.erm import diabetes_problem, partition_rows

    problem = diabetes_problem()
    rows = partition_rows(problem.n, 7)
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(problem.d, generator=g, dtype=torch.float64) for _ in range(7)]
    for lr in (0.0, 0.05):
        got = decentralized_step(problem, [p.clone() for p in params], rows,
                                 sim.SEVEN_NODE_GRAPH, lr)
        want = sim.decentralized_step(problem, params, rows, sim.SEVEN_NODE_GRAPH, lr)
        if got is None or len(got) != 7:
            raise ExerciseFailed("decentralized_step must return a list with one parameter "
                                 "vector per node (7)")
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if not torch.allclose(torch.as_tensor(a), b, atol=1e-10):
                what = ("pure averaging (lr = 0)" if lr == 0 else f"a step with lr = {lr}")
                raise ExerciseFailed(
                    f"node {i} is wrong after {what}: off by "
                    f"{(torch.as_tensor(a) - b).abs().max().item():.3g}. Node {i} averages "
                    f"itself and its neighbours {sim.SEVEN_NODE_GRAPH[i]} with equal weights, "
                    f"then subtracts lr times its own gradient at its current parameters.")
    return "correct: every node of the seven-node graph matches the reference"


def check_staleness_aware_lr(rule) -> str:
    """Check ``rule(alpha, staleness)`` against Zhang et al.'s alpha / tau (alpha for a fresh
    gradient, tau = 0), then train 16 simulated asynchronous workers with it."""
    from course_lib import async_sgd
    from course_lib.erm import diabetes_problem

    for alpha in (0.1, 0.3):
        for tau in (0, 1, 2, 7):
            want = async_sgd.staleness_aware_lr(alpha, tau)
            try:
                got = rule(alpha, tau)
            except ZeroDivisionError:
                raise ExerciseFailed(f"rule({alpha}, {tau}) divides by zero: a fresh gradient "
                                     f"(staleness 0) keeps the full rate alpha") from None
            if got is None or not isinstance(got, (int, float)):
                raise ExerciseFailed(f"rule({alpha}, {tau}) returned {got!r}: return a number")
            if abs(got - want) > 1e-12:
                raise ExerciseFailed(f"rule({alpha}, {tau}) = {got:g} but should be {want:g}: "
                                     f"divide alpha by the staleness (and use alpha for 0)")
    problem = diabetes_problem()
    sync = async_sgd.simulate_parameter_server(problem, 16, mode="sync", lr=0.1, gradients=600)
    log = async_sgd.simulate_parameter_server(problem, 16, lr=0.1, lr_rule=rule, gradients=600,
                                              jitter=0.3)
    final, target = async_sgd.losses(problem, log)[-1], async_sgd.losses(problem, sync)[-1]
    return (f"correct: with 16 simulated asynchronous workers the loss ends at {final:.4f}, "
            f"synchronous SGD at {target:.4f}")


def check_update_scale(update_scale) -> str:
    """Check ``update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
    growth_interval) -> (scale, growth_tracker)`` against the rule ``torch.amp.GradScaler``
    runs (``torch._amp_update_scale_``) on a sequence of clean and overflowing steps."""
    flags = [False, False, True, False, False, False, False, True, True, False, False, False]
    rule = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    scale, tracker = 1024.0, 0
    ref_scale, ref_tracker = torch.tensor([1024.0]), torch.zeros(1, dtype=torch.int32)
    for step, found_inf in enumerate(flags):
        out = update_scale(scale, tracker, found_inf, **rule)
        if not isinstance(out, tuple) or len(out) != 2:
            raise ExerciseFailed(f"update_scale returned {out!r}: return (scale, growth_tracker)")
        scale, tracker = out
        torch._amp_update_scale_(ref_scale, ref_tracker, torch.tensor([float(found_inf)]),
                                 rule["growth_factor"], rule["backoff_factor"],
                                 rule["growth_interval"])
        if (scale, tracker) != (ref_scale.item(), ref_tracker.item()):
            what = "an inf/NaN" if found_inf else "a clean step"
            raise ExerciseFailed(
                f"after step {step} ({what}) you have scale {scale:g}, tracker {tracker}; "
                f"GradScaler has scale {ref_scale.item():g}, tracker {ref_tracker.item()}. "
                f"On an inf: scale x backoff and the tracker back to 0; on a clean step: count "
                f"it, and when the count reaches growth_interval grow and start again from 0.")
    return f"correct: your rule follows GradScaler's for {len(flags)} steps (3 overflows)"


def check_stochastic_round(stochastic_round) -> str:
    """Check ``stochastic_round(x, generator)``: integers, within 1 of x, unbiased, random."""
    x = torch.linspace(-3.0, 3.0, 601, dtype=torch.float64).repeat(200)
    r = stochastic_round(x, torch.Generator().manual_seed(0))
    if r is None or not isinstance(r, torch.Tensor) or r.shape != x.shape:
        raise ExerciseFailed("return a tensor of the same shape as x")
    if not torch.equal(r, torch.round(r)):
        raise ExerciseFailed("some results are not whole numbers: round to an integer")
    worst = (r - x).abs().max().item()
    if worst >= 1:
        raise ExerciseFailed(f"a result is {worst:.3g} away from its input: round to one of "
                             f"the two neighbouring integers")
    if torch.equal(r, torch.round(x)) or torch.equal(r, torch.floor(x)):
        raise ExerciseFailed("that is deterministic rounding: round up with probability equal "
                             "to the fraction, using the generator")
    bias = (r - x).reshape(200, 601).mean(dim=0).abs().max().item()
    if bias > 0.15:
        raise ExerciseFailed(f"biased: averaged over 200 draws, a value is off by {bias:.2f}; "
                             f"round up with probability x - floor(x)")
    return f"correct: integers, within 1, unbiased (largest average error {bias:.3f})"


def check_weighted_average(aggregate) -> str:
    """Check ``aggregate(models, sizes)``: the average of the client models weighted by their
    number of rows, sum_k (n_k / n) w_k."""
    g = torch.Generator().manual_seed(0)
    models = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(3)]
    sizes = [10, 300, 40]
    want = sum(n / 350 * w for n, w in zip(sizes, models, strict=True))
    got = aggregate([m.clone() for m in models], list(sizes))
    if got is None:
        raise ExerciseFailed("aggregate returned None: return the new global model")
    got = torch.as_tensor(got, dtype=torch.float64)
    if got.shape != want.shape:
        raise ExerciseFailed(f"the average has shape {tuple(got.shape)}, a model has "
                             f"{tuple(want.shape)}")
    if not torch.allclose(got, want, atol=1e-12):
        plain = torch.stack(models).mean(dim=0)
        hint = (" That is the plain mean: weight each model by n_k / n." if
                torch.allclose(got, plain, atol=1e-12) else
                " Multiply each model by its share n_k / n of the rows and add them up.")
        raise ExerciseFailed(f"off by {(got - want).abs().max().item():.3g}.{hint}")
    return "correct: client models averaged with weights n_k / n"


def check_label_shards(partition, labels, clients: int = 20) -> str:
    """Check ``partition(labels, clients, seed)`` for McMahan et al.'s pathological split:
    disjoint, complete, near-equal sizes, at most two labels per client, seeded."""
    import numpy as np

    labels = np.asarray(labels)
    parts = partition(labels, clients, 0)
    if parts is None or len(parts) != clients:
        raise ExerciseFailed(f"return a list with one array of row indices per client "
                             f"({clients})")
    rows = np.concatenate([np.asarray(p) for p in parts])
    if len(rows) != len(set(rows.tolist())):
        raise ExerciseFailed("some row is given to two clients: deal every shard once")
    if len(rows) != len(labels):
        raise ExerciseFailed(f"{len(labels) - len(rows)} rows belong to no client: cut all of "
                             f"the sorted rows into shards")
    kinds = [len(set(labels[np.asarray(p)].tolist())) for p in parts]
    if max(kinds) > 2:
        raise ExerciseFailed(f"a client holds {max(kinds)} labels: cut each class into its "
                             f"own shards so that no shard straddles two labels")
    sizes = [len(p) for p in parts]
    if max(sizes) > 2 * min(sizes):
        raise ExerciseFailed(f"client sizes range from {min(sizes)} to {max(sizes)}: give "
                             f"every client the same number of shards")
    again = partition(labels, clients, 0)
    if any(not np.array_equal(np.sort(a), np.sort(b)) for a, b in zip(parts, again,
                                                                        strict=True)):
        raise ExerciseFailed("the same seed gave a different partition: draw every random "
                             "choice from a generator seeded with seed")
    return (f"correct: {clients} disjoint clients cover all {len(labels)} rows, at most two "
            f"labels each (mean {np.mean(kinds):.1f})")


def check_trimmed_mean(trimmed_mean) -> str:
    """Check ``trimmed_mean(updates, trim)`` (rows = clients) on hand-made updates with an
    outlier in every coordinate."""
    from course_lib import fl_security

    updates = torch.tensor([[1.0, 10.0, -3.0], [2.0, 20.0, -2.0], [3.0, 30.0, -1.0],
                            [4.0, 40.0, 0.0], [100.0, -500.0, 900.0]], dtype=torch.float64)
    for trim in (0.2, 0.4):
        got = trimmed_mean(updates.clone(), trim)
        want = fl_security.trimmed_mean(updates, trim)
        if got is None or torch.as_tensor(got).shape != want.shape:
            raise ExerciseFailed(f"return one value per coordinate, shape {tuple(want.shape)}")
        got = torch.as_tensor(got, dtype=torch.float64)
        if not torch.allclose(got, want):
            hint = (" Sort each coordinate (column) on its own: an attacker can be extreme in "
                    "one coordinate and ordinary in another."
                    if torch.allclose(got, updates[1:4].mean(dim=0)) else
                    f" Drop int(trim * n) = {int(trim * len(updates))} values from each end of "
                    f"every column, then average what is left.")
            raise ExerciseFailed(f"with trim = {trim} you got {got.tolist()}, the trimmed mean "
                                 f"is {want.tolist()}.{hint}")
    return "correct: coordinate-wise trimmed mean, outliers in every coordinate removed"


def check_pairwise_masks(pairwise_masks) -> str:
    """Check ``pairwise_masks(clients, d, seed)``: masks that sum to zero, hide each update and
    are reproducible from the seed."""
    masks = pairwise_masks(5, 40, 0)
    if masks is None or tuple(torch.as_tensor(masks).shape) != (5, 40):
        raise ExerciseFailed("return a (clients x d) tensor: one mask per client")
    masks = torch.as_tensor(masks, dtype=torch.float64)
    total = masks.sum(dim=0).abs().max().item()
    if total > 1e-6:
        raise ExerciseFailed(f"the masks do not cancel: their sum is off by {total:.3g}. Client "
                             f"i adds m_ij for j > i and subtracts m_ji for j < i")
    if masks.norm(dim=1).min().item() < 1.0:
        raise ExerciseFailed("some mask is (nearly) zero: it would show that client's update")
    again = torch.as_tensor(pairwise_masks(5, 40, 0), dtype=torch.float64)
    if not torch.equal(masks, again):
        raise ExerciseFailed("the same seed gave other masks: a pair must be able to agree on "
                             "its mask, so draw it from a generator seeded by (seed, i, j)")
    return "correct: the masks cancel in the sum, and each one hides its client's update"


def check_half_latency_size(half_latency_size) -> str:
    """Check ``half_latency_size(alpha, beta, p)``: the message size n at which the efficient
    ring's latency part 2 (p - 1) alpha equals its bandwidth part 2 (p - 1) / p n beta."""
    for alpha, beta, p in ((1e-3, 1e-9, 2), (5e-5, 2e-10, 8)):
        n = half_latency_size(alpha, beta, p)
        if n is None:
            raise ExerciseFailed("half_latency_size returned None: return the size n in bytes")
        latency, bandwidth = 2 * (p - 1) * alpha, 2 * (p - 1) / p * n * beta
        if abs(latency - bandwidth) > 1e-9 * latency:
            raise ExerciseFailed(f"for alpha={alpha}, beta={beta}, p={p} you gave n = {n:.4g}: "
                                 f"there the latency part is {latency:.3g} s but the bandwidth "
                                 f"part {bandwidth:.3g} s")
    return "correct: at that size both parts cost the same"


def check_large_batch_lr(large_batch_lr) -> str:
    """Check ``large_batch_lr(step, base_lr, base_batch, batch, warmup_steps)``: the linear
    scaling rule's target, reached by a linear warm-up (lesson 4)."""
    from course_lib import data_parallel as dp

    for step, batch, warm in [(0, 256, 10), (5, 256, 10), (10, 256, 10), (50, 512, 10),
                              (3, 64, 0)]:
        target = dp.linear_scaling_lr(0.05, 32, batch)
        right = dp.warmup_lr(step, target, warm, 0.05) if warm else target
        got = large_batch_lr(step, 0.05, 32, batch, warm)
        if got is None or abs(got - right) > 1e-12:
            raise ExerciseFailed(f"step {step}, batch {batch}, warm-up {warm} steps: you gave "
                                 f"{got!r}, the schedule gives {right:.4g} (target "
                                 f"{target:.4g})")
    return "correct: the scaled target, reached by a linear warm-up"


def check_1f1b_order(one_f_one_b) -> str:
    """Check ``one_f_one_b(stage, stages, micro_batches)`` against the 1F1B schedule: the
    first action that differs, and what it should be (lesson 5)."""
    from course_lib import pipeline as pp

    for stages, micro_batches in [(2, 4), (4, 8), (4, 2), (3, 1)]:
        for stage in range(stages):
            got = one_f_one_b(stage, stages, micro_batches)
            right = pp.one_f_one_b_schedule(stage, stages, micro_batches)
            if got != right:
                got = list(got or [])
                pairs = enumerate(zip(got, right, strict=False))
                first = next((k for k, (a, b) in pairs if a != b), min(len(got), len(right)))
                should = right[first] if first < len(right) else "nothing"
                is_ = got[first] if first < len(got) else "missing"
                raise ExerciseFailed(f"stage {stage} of {stages}, m = {micro_batches}: action "
                                     f"{first} should be {should} but is {is_} (right order: "
                                     f"{right})")
    return "correct: every stage's 1F1B order matches"
