"""Interleaved 1F1B and zero-bubble schedules (course_lib.interleaving) give the gradients of the
unsplit model, on 2 gloo ranks in float64."""

import pytest
import torch

from course_lib import WorkerError, launch
from course_lib import interleaving as il
from course_lib.models import mlp
from course_lib.pipeline import reference_gradients


def _pieces(n):
    model = mlp((12, *[10] * (n - 1), 4), activation=torch.nn.Tanh, seed=2, dtype=torch.float64)
    layers = list(model)  # linear, tanh, ..., linear: each linear with its activation
    return [torch.nn.Sequential(*layers[2 * i:2 * i + 2]) for i in range(n)]


@pytest.mark.parametrize(("schedule", "micro_batches"), [
    ("interleaved 1F1B", 2), ("interleaved 1F1B", 4), ("interleaved zero bubble", 4),
    ("ZBV zero bubble", 4), ("GPipe", 4), ("1F1B", 2)])
def test_schedules_give_the_unsplit_models_gradients(schedule, micro_batches):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 12, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (8,), generator=g)
    count = 2 if schedule in il.ONE_PIECE else 4  # p = 2 ranks, one piece or v = 2 each
    pieces = _pieces(count)
    loss, grads = reference_gradients(_pieces(count), x, y)
    per_piece = []
    offset = 0
    for piece in pieces:
        n = len(list(piece.parameters()))
        per_piece.append(grads[offset:offset + n])
        offset += n
    results = launch(il.run, 2, args=(pieces, x, y, micro_batches, schedule))
    seen = set()
    for result in results:
        for index, got in zip(result["pieces"], result["grads"], strict=True):
            seen.add(index)
            for a, b in zip(got, per_piece[index], strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        if result["micro_losses"]:
            torch.testing.assert_close(sum(result["micro_losses"]) / micro_batches, loss)
    assert seen == set(range(count))


def test_placements():
    assert il.placement("interleaved 1F1B", 2, 3) == [[0, 2, 4], [1, 3, 5]]
    assert il.placement("ZBV zero bubble", 3, 2) == [[0, 5], [1, 4], [2, 3]]
    with pytest.raises(ValueError, match="exactly 2"):
        il.placement("ZBV zero bubble", 2, 3)
    assert il.placement("GPipe", 3, 1) == il.placement("1F1B", 3, 1) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="one piece per rank, got v = 2"):
        il.placement("1F1B", 2, 2)
    with pytest.raises(ValueError, match="unknown schedule"):
        il.placement("PipeDream", 2, 1)


def test_a_batch_that_does_not_divide_is_refused():
    x, y = torch.randn(6, 12, dtype=torch.float64), torch.zeros(6, dtype=torch.long)
    with pytest.raises(WorkerError, match="does not divide into 4"):
        launch(il.run, 2, args=(_pieces(4), x, y, 4))



def test_padded_pieces_compute_the_same_values_and_gradients():
    piece = _pieces(1)[0]
    x = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)
    out = il.Padded(piece, 0.001, 0.002)(x)
    out.sum().backward()
    padded_grads = [x.grad.clone()] + [p.grad.clone() for p in piece.parameters()]
    x.grad = None
    piece.zero_grad()
    expected = piece(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for a, b in zip(padded_grads, [x.grad] + [p.grad for p in piece.parameters()], strict=True):
        torch.testing.assert_close(a, b)


def test_gpipe_measured_as_the_others_idles_at_least_the_formulas_bubble():
    x = torch.randn(16, 12, dtype=torch.float64)
    y = torch.randint(0, 4, (16,))
    results = launch(il.measure_bubble, 2, args=(_pieces(2), x, y, 4, "GPipe"),
                     kwargs=dict(forward_seconds=0.01, backward_seconds=0.02, repeats=2))
    assert all(r["work"] == pytest.approx(4 * 0.03) for r in results)
    # no step is shorter than its critical path, (m + p - 1)(F + B): the padded actions never
    # take less than their padding, and each waits for its input. So at least the formula's
    # bubble, (p - 1) / (m + p - 1) = 0.2, is idle (a bound by construction, not a timing)
    assert il.bubble_of(results) >= 0.2 - 1e-9


def test_measure_bubble_times_every_repeat_and_knows_each_ranks_work():
    x = torch.randn(16, 12, dtype=torch.float64)
    y = torch.randint(0, 4, (16,))
    results = launch(il.measure_bubble, 2, args=(_pieces(4), x, y, 2),
                     kwargs=dict(forward_seconds=0.002, backward_seconds=0.004, repeats=2))
    assert all(r["work"] == pytest.approx(2 * 2 * 0.006) and len(r["walls"]) == 2
               for r in results)


def test_bubble_of_uses_the_slowest_rank_of_each_repeat():
    results = [dict(walls=[1.0, 2.0], work=0.5), dict(walls=[1.5, 1.0], work=0.5)]
    assert il.bubble_of(results) == pytest.approx(1 - 0.5 / 1.75)


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 2), (2, 2, 4), (2, 2, 8), (4, 2, 8), (4, 3, 4),
                                           (2, 1, 6), (3, 2, 6)])
def test_the_simulated_interleaved_bubble_is_the_formulas(p, v, m):
    from course_lib.cost_models import bubble_fraction

    simulated = il.simulate_interleaved(p, v, m, forward=1.0, backward=2.0)
    assert simulated["bubble"] == pytest.approx(bubble_fraction(p, m, v), abs=1e-12)
    # the ideal makespan with no bubble is m v (F + B); the bubble adds (p - 1)(F + B)
    assert simulated["makespan"] == pytest.approx((m * v + p - 1) * 3.0)


def test_each_rank_runs_every_chunk_and_micro_batch_once_each_way():
    p, v, m = 3, 2, 6
    for rank in range(p):
        order = il.interleaved_order(rank, p, v, m)
        forwards = [(c, i) for kind, c, i in order if kind == "forward"]
        backwards = [(c, i) for kind, c, i in order if kind == "backward"]
        everything = sorted((c, i) for c in range(v) for i in range(m))
        assert sorted(forwards) == everything and sorted(backwards) == everything
        for c, i in backwards:  # a backward never comes before its own forward
            assert order.index(("forward", c, i)) < order.index(("backward", c, i))
    with pytest.raises(ValueError, match="multiple of p"):
        il.interleaved_order(0, 2, 2, 3)
    for args, named in (((0, 0, 1, 4), "p must be"), ((0, 2, 0, 4), "v must be"),
                        ((0, 2, 1, 0), "m must be"), ((5, 2, 1, 2), "rank must be one of 0 to")):
        with pytest.raises(ValueError, match=named):
            il.interleaved_order(*args)
    for args, named in (((2, 1, 0), "m must be"), ((2, 2, 2, 0.0, 0.0), "takes no time"),
                        ((2, 2, 2, -1.0), "must be zero or more")):
        with pytest.raises(ValueError, match=named):
            il.simulate_interleaved(*args)


def test_a_per_action_overhead_lengthens_the_step_but_not_the_formula():
    plain = il.simulate_interleaved(2, 2, 4, 0.02, 0.04)
    slower = il.simulate_interleaved(2, 2, 4, 0.02, 0.04, overhead=0.002)
    assert slower["makespan"] > plain["makespan"]
    assert slower["bubble"] == pytest.approx(plain["bubble"])


def test_weight_padding_leaves_values_and_gradients_alone():
    piece = _pieces(1)[0]
    x = torch.randn(3, 12, dtype=torch.float64)
    padded = il.Padded(piece, 0.0, 0.0, weight_seconds=0.001)
    padded(x).sum().backward()
    got = [p.grad.clone() for p in piece.parameters()]
    piece.zero_grad()
    piece(x).sum().backward()
    for a, b in zip(got, [p.grad for p in piece.parameters()], strict=True):
        torch.testing.assert_close(a, b)


def test_placement_and_order_refuse_ranks_or_sizes_that_are_not_whole_numbers():
    import numpy as np
    for p, v in ((0, 2), (-1, 2), (2, 2.0), (2.0, 2)):
        with pytest.raises(ValueError, match="must be a whole number of at least 1"):
            il.placement("interleaved 1F1B", p, v)
    assert il.interleaved_order(np.int64(0), 2, 2, 2) == il.interleaved_order(0, 2, 2, 2)
    with pytest.raises(ValueError, match="rank must be one of 0 to p - 1"):
        il.interleaved_order(True, 2, 2, 2)
