"""Clients' local training (course_lib.local_training): the lecture's loop, its two parts, and
the batched engine built from the same parts."""

import pytest
import torch

from course_lib import federated as fl
from course_lib import partitions as pt
from course_lib.data import load_digits
from course_lib.federated import LocalTraining
from course_lib.local_training import local_step, mini_batches, train_clients
from course_lib.models import DIGITS_MLP

DIGITS = load_digits()
LABELS = DIGITS.y_train.numpy()


def test_batched_gradient_equals_each_models_own():
    g = torch.Generator().manual_seed(0)
    W = torch.stack([DIGITS_MLP.init(s) for s in range(3)])
    sizes = [5, 3, 1]  # uneven batches, padded to 5 rows with weight 0
    X = torch.randn(3, 5, 64, generator=g, dtype=torch.float64)
    Y = torch.randint(10, (3, 5), generator=g)
    weights = torch.zeros(3, 5, dtype=torch.float64)
    for i, n in enumerate(sizes):
        weights[i, :n] = 1.0 / n
    losses, grads = DIGITS_MLP.loss_and_gradient_batched(W, X, Y, weights)
    for i, n in enumerate(sizes):
        loss, grad = DIGITS_MLP.loss_and_gradient(W[i], X[i, :n], Y[i, :n])
        assert losses[i].item() == pytest.approx(loss, rel=1e-12)
        torch.testing.assert_close(grads[i], grad, rtol=0, atol=1e-12)


def test_train_clients_equals_client_update_for_each_client():
    parts = pt.quantity_skew(LABELS, 6, alpha=1.0)  # clients of very different sizes
    x, y, w = DIGITS.x_train.double(), DIGITS.y_train, DIGITS_MLP.init(1)
    local = LocalTraining(epochs=2, batch=7, lr=0.1, mu=0.05)
    seeds = [[3, 0, k] for k in range(6)]
    budgets = [None, 2, None, 1, None, None]  # two stragglers
    corrections = [torch.full_like(w, 0.01 * k) for k in range(6)]
    V, steps = train_clients(w, [(x[p], y[p]) for p in parts], local, seeds, budgets=budgets,
                             corrections=corrections)
    for k, p in enumerate(parts):
        v, n = fl.client_update(w, x[p], y[p], local, seeds[k], correction=corrections[k],
                                max_steps=budgets[k])
        assert steps[k] == n
        torch.testing.assert_close(V[k], v, rtol=0, atol=1e-10)


@pytest.mark.parametrize("local, method", [
    (LocalTraining(epochs=5, batch=10, lr=0.1), {}),                                  # FedAvg
    (LocalTraining(epochs=5, batch=10, lr=0.1, mu=0.1),
     dict(stragglers=0.5, keep_partial=True)),                                        # FedProx
    (LocalTraining(epochs=5, batch=10, lr=0.1), dict(scaffold=True)),                 # SCAFFOLD
    (LocalTraining(epochs=5, batch=None, lr=0.1), {}),                                # B = inf
], ids=["FedAvg", "FedProx", "SCAFFOLD", "B=inf"])
def test_batched_rounds_equal_the_per_client_loop(local, method):
    parts = pt.label_shards(LABELS, 20)
    plan = fl.Federation(rounds=4, fraction=0.3, **method)
    batched = fl.federated(DIGITS, parts, local, plan, batched=True)
    loop = fl.federated(DIGITS, parts, local, plan, batched=False)
    torch.testing.assert_close(batched["params"], loop["params"], rtol=0, atol=1e-10)
    assert batched["accuracy"] == pytest.approx(loop["accuracy"], abs=1e-12)


def test_no_clients_and_empty_clients():
    w = DIGITS_MLP.init(0)
    V, steps = train_clients(w, [], LocalTraining(), [])
    assert V.shape == (0, len(w)) and steps == []
    empty = (DIGITS.x_train[:0].double(), DIGITS.y_train[:0])
    with pytest.raises(ValueError, match="holds no rows"):
        train_clients(w, [empty], LocalTraining(), [[0]])


@pytest.mark.parametrize("bad, said", [(dict(epochs=0), "epochs E must be a whole number >= 1"),
                                       (dict(epochs=True), "epochs E must be"),
                                       (dict(epochs=1.5), "epochs E must be"),
                                       (dict(batch=False), "batch B must be"),
                                       (dict(lr=-0.1), "lr and mu must be zero or more")])
def test_impossible_local_training_is_refused_by_name(bad, said):
    with pytest.raises(ValueError, match=said):
        LocalTraining(**bad)


def test_mini_batches_are_each_epochs_fresh_order_cut_into_batches():
    table = mini_batches(23, LocalTraining(epochs=3, batch=10), seed=[4, 1])
    assert table.shape == (9, 10)  # 3 batches per epoch: 10, 10 and 3 rows
    for epoch in range(3):
        rows = table[3 * epoch:3 * epoch + 3].flatten()
        assert sorted(rows[rows >= 0].tolist()) == list(range(23))  # every row once per epoch
        assert (table[3 * epoch + 2, 3:] == -1).all()  # the short batch is padded
    assert not torch.equal(table[:3], table[3:6])  # a fresh order per epoch
    assert torch.equal(table, mini_batches(23, LocalTraining(epochs=3, batch=10), [4, 1]))
    assert torch.equal(mini_batches(23, LocalTraining(epochs=3, batch=10), [4, 1], 4), table[:4])
    assert mini_batches(5, LocalTraining(epochs=2, batch=None), 0).shape == (2, 5)
    assert mini_batches(5, LocalTraining(epochs=1, batch=50), 0).shape == (1, 5)


def test_local_step_is_sgd_with_fedprox_and_scaffolds_terms():
    v, w, g = (torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.5, -0.5]))
    c = torch.tensor([0.1, 0.2])
    torch.testing.assert_close(local_step(v, w, g, LocalTraining(lr=0.1)), v - 0.1 * g)
    torch.testing.assert_close(local_step(v, w, g, LocalTraining(lr=0.1, mu=2.0), c),
                               v - 0.1 * (g + 2.0 * (v - w) + c))
