"""Mixture of experts (course_lib.experts): routing, capacity, the balancing loss, and expert
parallelism on gloo ranks against one process in float64."""

import numpy as np
import pytest
import torch

from course_lib import experts as ex
from course_lib import launch

pytestmark = pytest.mark.filterwarnings("ignore:.*oversubscribed")  # 4 ranks: results only
D = 6


def tokens(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=g, dtype=torch.float64), \
        torch.randn(n, D, generator=g, dtype=torch.float64)


def moe(num_experts=4, k=2, factor=100.0):
    return ex.MixtureOfExperts(D, 10, num_experts, k, factor, seed=3, dtype=torch.float64)


def test_the_gates_are_the_top_k_probabilities_renormalised_when_k_is_two():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    experts, gates, probs = ex.route(logits, 1)
    assert experts[:, 0].tolist() == [1, 0]
    torch.testing.assert_close(gates[:, 0], probs.max(dim=-1).values)
    experts, gates, _ = ex.route(logits, 2)
    assert experts.tolist() == [[1, 2], [0, 1]] or experts.tolist() == [[1, 2], [0, 2]]
    torch.testing.assert_close(gates.sum(dim=-1), torch.ones(2))
    for k in (0, 4, 1.5, True):
        with pytest.raises(ValueError, match="k must be a whole number between 1 and the"):
            ex.route(logits, k)


def test_capacity_is_the_factor_times_an_even_share():
    assert ex.capacity(10, 4, 2, 1.0) == 5 and ex.capacity(10, 4, 2, 1.25) == 7
    assert ex.capacity(1, 8, 1, 1.0) == 1
    for factor in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="capacity factor must be positive"):
            ex.capacity(10, 4, 2, factor)
    for args in ((10, 0, 1), (10, 4, 0), (-1, 4, 1)):  # 0 experts divided by zero
        with pytest.raises(ValueError, match="need experts >= 1, k >= 1 and tokens >= 0"):
            ex.capacity(*args, 1.0)


def test_first_choices_are_served_before_second_choices_in_token_order():
    experts = torch.tensor([[0, 1], [0, 1], [0, 1]])
    assert ex.assign_slots(experts, 2, 2).tolist() == [[0, 0], [1, 1], [-1, -1]]
    # expert 1 is full of first choices before token 0's second choice reaches it
    experts = torch.tensor([[0, 1], [1, 0], [1, 0]])
    assert ex.assign_slots(experts, 2, 2).tolist() == [[0, -1], [0, 1], [1, -1]]


def test_the_balancing_loss_is_one_for_an_even_load_and_more_for_a_skewed_one():
    even = ex.balancing_loss(torch.full((4, 2), 0.5), torch.tensor([[0], [1], [0], [1]]), 2)
    torch.testing.assert_close(even, torch.tensor(1.0))
    skewed = ex.balancing_loss(torch.tensor([[0.9, 0.1]] * 4), torch.zeros(4, 1, dtype=int), 2)
    assert skewed > 1.5


@pytest.mark.parametrize("k", [1, 2])
def test_without_drops_each_token_gets_its_experts_outputs_weighted_by_its_gates(k):
    layer, (x, _) = moe(k=k), tokens(12)
    y, _ = layer(x)
    assert layer.stats["dropped"] == 0
    experts, gates, _ = ex.route(layer.router(x), k)
    for t in range(len(x)):  # token by token, by hand
        want = sum(gates[t, j] * layer.experts[int(experts[t, j])](x[t]) for j in range(k))
        torch.testing.assert_close(y[t], want)


def test_the_tokens_dropped_at_a_capacity_factor_are_counted_exactly():
    layer, (x, _) = moe(k=2, factor=0.5), tokens(40)
    y, _ = layer(x)
    cap = ex.capacity(40, 4, 2, 0.5)
    load = layer.stats["tokens_per_expert"]
    assert layer.stats["capacity"] == cap and sum(load) == 80
    assert layer.stats["dropped"] == sum(max(0, n - cap) for n in load) > 0
    experts, gates, _ = ex.route(layer.router(x), 2)
    slots = ex.assign_slots(experts, 4, cap)
    for t in range(len(x)):  # a dropped assignment adds nothing
        want = sum(gates[t, j] * layer.experts[int(experts[t, j])](x[t]) for j in range(2)
                   if slots[t, j] >= 0)
        torch.testing.assert_close(y[t], want if torch.is_tensor(want) else torch.zeros(D,
                                   dtype=torch.float64))


@pytest.mark.parametrize("ranks, k, factor", [(2, 1, 100.0), (2, 2, 100.0), (2, 2, 0.5),
                                              (4, 2, 1.0)])
def test_experts_spread_over_ranks_compute_what_one_process_does(ranks, k, factor):
    layer, (x, d_out) = moe(k=k, factor=factor), tokens(8 * ranks)
    results = launch(ex.run_expert_parallel, ranks, args=(layer, x, d_out))
    n = len(x) // ranks
    for r in range(ranks):  # one process, each rank's tokens as one batch (capacity per batch)
        y, _ = layer(x[r * n:(r + 1) * n])
        y.backward(d_out[r * n:(r + 1) * n])
        torch.testing.assert_close(results[r]["out"], y.detach())
        assert results[r]["stats"]["dropped"] == layer.stats["dropped"]
    local = 4 // ranks
    for r, result in enumerate(results):
        torch.testing.assert_close(result["router_grad"], layer.router.weight.grad)
        for j, grads in enumerate(result["expert_grads"]):
            for got, p in zip(grads, layer.experts[r * local + j].parameters(), strict=True):
                torch.testing.assert_close(got, p.grad)
        assert result["sent"]["messages"] == 2  # the forward's dispatch and combine, each timed
        assert len(result["sent"]["seconds"]) == 2 and min(result["sent"]["seconds"]) > 0


def test_experts_that_do_not_divide_among_the_ranks_are_refused():
    layer, (x, d_out) = moe(num_experts=3), tokens(8)
    with pytest.raises(Exception, match="3 experts do not divide among 2 ranks"):
        launch(ex.run_expert_parallel, 2, args=(layer, x, d_out))


def test_training_records_every_steps_load_and_the_balancing_loss_evens_it():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 12, generator=g), torch.randint(0, 3, (200,), generator=g)
    plain = ex.train_with_experts(x, y, balance=0.0, steps=40, batch=64)
    again = ex.train_with_experts(x, y, balance=0.0, steps=40, batch=64)
    assert plain["loads"].shape == (40, 4) and (plain["loads"].sum(dim=1) == 64).all()
    assert torch.equal(plain["loads"], again["loads"]) and plain["losses"] == again["losses"]
    balanced = ex.train_with_experts(x, y, balance=1.0, steps=40, batch=64)
    busiest = [(r["loads"][-10:].max(dim=1).values / 64).mean() for r in (plain, balanced)]
    assert busiest[1] < busiest[0]
    assert plain["losses"][-1] < plain["losses"][0]
    for steps in (0, 2.5, True):
        with pytest.raises(ValueError, match="steps and batch must be whole numbers from 1"):
            ex.train_with_experts(x, y, balance=0.0, steps=steps)
    with pytest.raises(ValueError, match="capacity factor must be positive"):
        ex.capacity(8, 4, 2, True)


def test_a_gpt_with_experts_routes_each_token_alone_and_refuses_impossible_mixtures():
    from course_lib.models import tiny_gpt

    gpt = ex.with_experts(tiny_gpt(vocab=10, d_model=8, layers=2, heads=2, context=8), 4, k=2)
    tokens = torch.randint(0, 10, (3, 8), generator=torch.Generator().manual_seed(0))
    whole = gpt(tokens)
    # capacity: every token (nothing dropped), so a token's logits do not depend on the batch
    torch.testing.assert_close(gpt(tokens[:1]), whole[:1])
    block = gpt.blocks[0]
    assert not hasattr(block, "fc1") and block.mlp.moe.stats["dropped"] == 0
    starts = [tuple(w.flatten()[:8].tolist()) for b in gpt.blocks
              for w in [b.mlp.moe.router.weight] + [e.fc1.weight for e in b.mlp.moe.experts]]
    assert len(set(starts)) == len(starts) == 2 * 5  # no router or expert starts like another
    assert block.mlp.aux is not None and len(block.mlp.moe.experts) == 4
    for experts, k in ((0, 1), (4, 5), (4, 0)):
        with pytest.raises(ValueError, match="1 <= k <= experts"):
            ex.with_experts(tiny_gpt(vocab=10, d_model=8, layers=1, heads=2, context=8),
                            experts, k)


def test_expert_gradients_are_divided_by_the_ranks_they_served():
    params = [torch.nn.Parameter(torch.ones(3)) for _ in range(2)]
    for p in params:
        p.grad = torch.full((3,), 6.0)
    ex.average_expert_gradients(params, ep=3)  # no replicas: only the division
    assert all(torch.equal(p.grad, torch.full((3,), 2.0)) for p in params)


def test_numpy_whole_numbers_are_taken_wherever_ints_are():
    # route refused np.int64(2) with "k must be a whole number ..., got 2"
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    assert ex.route(logits, np.int64(2))[0].shape == (2, 2)
    assert ex.capacity(np.int64(10), np.int64(4), np.int64(2), np.float64(1.0)) == 5
    layer = ex.MixtureOfExperts(np.int64(D), np.int64(10), np.int64(4), np.int64(2), 100.0,
                                seed=3, dtype=torch.float64)
    x = torch.randn(6, D, dtype=torch.float64)
    torch.testing.assert_close(layer(x)[0], moe()(x)[0])


def test_a_mixture_takes_tokens_as_rows_and_says_so():
    with pytest.raises(ValueError, match=r"a mixture's x is \(tokens, d_model\)\), got logits of "
                                         r"shape \(2, 3, 4\)"):
        moe()(torch.randn(2, 3, D, dtype=torch.float64))  # was an IndexError deep in the slots


@pytest.mark.parametrize("args, message", [
    (dict(num_experts=2.0), "num_experts must be a positive whole number"),  # a torch TypeError
    (dict(num_experts="4"), "num_experts must be a positive whole number"),
    (dict(d_model=None), "d_model must be a positive whole number"),
    (dict(k=0), r"1 <= k <= experts"),  # these three were only refused at the first batch
    (dict(num_experts=2, k=3), r"1 <= k <= experts"),
    (dict(capacity_factor=0.0), "capacity factor must be positive"),
    (dict(capacity_factor="1.25"), "capacity factor must be positive")])
def test_a_mixture_that_cannot_route_is_refused_when_made(args, message):
    with pytest.raises(ValueError, match=message):
        ex.MixtureOfExperts(**dict(d_model=D, d_hidden=10) | args)


@pytest.mark.parametrize("args", [(10, 2, 5, 1.0), ("10", 4, 2, 1.0), (10, 4, 2.0, 1.0),
                                  (10, None, 2, 1.0), (10, 4, True, 1.0)])
def test_capacity_refuses_k_above_the_experts_and_counts_that_are_no_whole_numbers(args):
    # capacity(10, 2, 5, 1.0) used to be 25; a string was a raw TypeError
    with pytest.raises(ValueError, match="need experts >= 1, k >= 1 and tokens >= 0, whole "
                                         "numbers, and 1 <= k <= experts"):
        ex.capacity(*args)
