"""Federated learning on the digits (course_lib.federated)."""

import pytest
import torch

from course_lib import federated as fl
from course_lib import launch
from course_lib import partitions as pt
from course_lib.data import load_digits


@pytest.fixture(scope="module")
def digits():
    return load_digits()


@pytest.fixture(scope="module")
def shards(digits):
    return pt.label_shards(digits.y_train.numpy(), 20)


def test_hand_written_gradient_equals_autograd():
    w = fl.init_model(seed=3)
    x, y = torch.randn(9, 64, dtype=torch.float64), torch.randint(10, (9,))
    loss, grad = fl.loss_and_gradient(w, x, y)
    wt = w.clone().requires_grad_(True)
    reference = torch.nn.functional.cross_entropy(fl.forward(wt, x), y)
    reference.backward()
    assert loss == pytest.approx(reference.item())
    torch.testing.assert_close(grad, wt.grad)
    assert len(w) == fl.num_parameters() == 64 * 32 + 32 + 32 * 10 + 10


def test_fedavg_with_one_epoch_and_infinite_batch_equals_fedsgd(digits, shards):
    log = fl.federated(digits, shards, rounds=1, fraction=1.0, epochs=1, batch=None, lr=0.3)
    want = fl.fedsgd_step(digits, shards, fl.init_model(), lr=0.3)
    torch.testing.assert_close(log["w"], want, atol=1e-6, rtol=0)


def test_averaging_is_weighted_by_client_size(digits):
    parts = [torch.arange(0, 10), torch.arange(10, 400)]  # very unequal clients
    log = fl.federated(digits, parts, rounds=1, fraction=1.0, epochs=1, batch=None, lr=0.3)
    w0, x, y = fl.init_model(), digits.x_train.double(), digits.y_train
    locals_ = [w0 - 0.3 * fl.loss_and_gradient(w0, x[p], y[p])[1] for p in parts]
    torch.testing.assert_close(log["w"], (10 * locals_[0] + 390 * locals_[1]) / 400)
    assert not torch.allclose(log["w"], (locals_[0] + locals_[1]) / 2)


def test_real_processes_and_one_process_give_the_same_model(digits, shards):
    settings = dict(rounds=3, fraction=0.5, epochs=2, batch=10, lr=0.1, seed=4)
    alone = fl.federated(digits, shards, **settings)
    ranks = launch(fl.federated, 2, args=(digits, shards), kwargs=settings)
    for result in ranks:
        torch.testing.assert_close(result["w"], alone["w"], atol=1e-6, rtol=0)
    assert ranks[0]["accuracy"] == pytest.approx(alone["accuracy"])


def test_scaffold_and_server_optimisers_agree_across_processes_too(digits, shards):
    settings = dict(rounds=2, fraction=0.5, epochs=1, batch=10, lr=0.1, seed=1,
                    method="scaffold", server="adam", server_lr=0.01)
    alone = fl.federated(digits, shards, **settings)
    ranks = launch(fl.federated, 2, args=(digits, shards), kwargs=settings)
    torch.testing.assert_close(ranks[1]["w"], alone["w"], atol=1e-6, rtol=0)


def test_fedavg_learns_and_reports_rounds_to_target(digits):
    parts = pt.iid(digits.y_train.numpy(), 20)
    log = fl.federated(digits, parts, rounds=40, fraction=0.2, epochs=2, batch=10, lr=0.1,
                       target=0.85)
    assert log["accuracy"][0] < 0.3 and log["best"][-1] >= 0.85
    assert log["rounds_to_target"] == len(log["accuracy"]) - 1  # it stopped at the target
    assert log["bytes_per_round"][0] == 2 * 4 * fl.num_parameters() * 4  # 4 clients, both ways


def test_rounds_to_target_reads_the_best_so_far_curve():
    assert fl.rounds_to_target([0.1, 0.5, 0.92, 0.88, 0.95], 0.9) == 2
    assert fl.rounds_to_target([0.1, 0.5], 0.9) is None


def test_dropped_stragglers_do_no_work_and_kept_ones_do_part(digits, shards):
    base = dict(rounds=1, fraction=1.0, epochs=1, batch=None, lr=0.3)
    all_slow_dropped = fl.federated(digits, shards, stragglers=1.0, **base)
    torch.testing.assert_close(all_slow_dropped["w"], fl.init_model())  # nobody reported
    kept = fl.federated(digits, shards, stragglers=1.0, keep_partial=True, **base)
    normal = fl.federated(digits, shards, **base)
    torch.testing.assert_close(kept["w"], normal["w"])  # one step is all a B=inf epoch has


def test_fedprox_pulls_local_models_towards_the_global_one(digits):
    w = fl.init_model()
    x, y = digits.x_train[:200].double(), digits.y_train[:200]
    free, _ = fl.client_update(w, x, y, epochs=5, batch=10, lr=0.1, seed=0)
    prox, _ = fl.client_update(w, x, y, epochs=5, batch=10, lr=0.1, seed=0, mu=1.0)
    assert (prox - w).norm() < (free - w).norm()
    _, steps = fl.client_update(w, x, y, epochs=5, batch=10, lr=0.1, seed=0, max_steps=7)
    assert steps == 7 and fl.local_steps(200, 5, 10) == 100


def test_server_optimisers_move_along_the_average_update():
    w, avg = torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    assert torch.equal(fl.server_step(w, avg, {}, "avg", 1.0), avg)
    state = {}
    first = fl.server_step(w, avg, state, "avgm", 0.5)
    torch.testing.assert_close(first, w - 0.5 * (w - avg))
    second = fl.server_step(first, avg, state, "avgm", 0.5)  # momentum: a bigger step
    assert (first - second).norm() > 0.5 * (first - avg).norm()
    adam = fl.server_step(w, avg, {}, "adam", 0.1)
    torch.testing.assert_close(adam, w - 0.1 * 0.1 / (0.1 + 1e-3), rtol=0, atol=1e-3)
    with pytest.raises(ValueError, match="unknown server"):
        fl.server_step(w, avg, {}, "sgd", 1.0)


def test_bad_settings_are_rejected(digits, shards):
    with pytest.raises(ValueError, match="unknown method"):
        fl.federated(digits, shards, rounds=1, method="fedsgd")
    with pytest.raises(ValueError, match="fraction"):
        fl.federated(digits, shards, rounds=1, fraction=0)


def test_hierarchical_fedavg_learns_and_counts_both_kinds_of_links(digits):
    parts = pt.iid(digits.y_train.numpy(), 12)
    edges = [list(range(0, 6)), list(range(6, 12))]
    log = fl.hierarchical(digits, parts, edges, cloud_rounds=4, edge_rounds=2, fraction=0.5,
                          epochs=1, batch=10, lr=0.1)
    d = fl.num_parameters()
    assert len(log["accuracy"]) == 5 and log["accuracy"][-1] > log["accuracy"][0] + 0.3
    assert log["edge_to_cloud"] == 4 * 2 * 2 * d * 4
    assert log["client_to_edge"] == 4 * 2 * 2 * (2 * 3 * d * 4)
