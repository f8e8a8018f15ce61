"""Federated learning on the digits (course_lib.federated)."""

import numpy as np
import pytest
import torch

from course_lib import federated as fl
from course_lib import launch
from course_lib import partitions as pt
from course_lib.data import load_digits
from course_lib.models import DIGITS_MLP

D = DIGITS_MLP.num_parameters
FEDSGD = fl.LocalTraining(epochs=1, batch=None, lr=0.3)  # E = 1, B = infinity


@pytest.fixture(scope="module")
def digits():
    return load_digits()


@pytest.fixture(scope="module")
def shards(digits):
    return pt.label_shards(digits.y_train.numpy(), 20)


def test_fedavg_with_one_epoch_and_infinite_batch_equals_fedsgd(digits, shards):
    log = fl.federated(digits, shards, FEDSGD, fl.Federation(rounds=1, fraction=1.0))
    want = fl.fedsgd_step(digits, shards, DIGITS_MLP.init(), lr=0.3)
    torch.testing.assert_close(log["params"], want, atol=1e-6, rtol=0)


def test_averaging_is_weighted_by_client_size(digits):
    parts = [torch.arange(0, 10), torch.arange(10, 400)]  # very unequal clients
    log = fl.federated(digits, parts, FEDSGD, fl.Federation(rounds=1, fraction=1.0))
    w0, x, y = DIGITS_MLP.init(), digits.x_train.double(), digits.y_train
    locals_ = [w0 - 0.3 * DIGITS_MLP.loss_and_gradient(w0, x[p], y[p])[1] for p in parts]
    torch.testing.assert_close(log["params"], (10 * locals_[0] + 390 * locals_[1]) / 400)
    assert not torch.allclose(log["params"], (locals_[0] + locals_[1]) / 2)


def test_real_processes_and_one_process_give_the_same_model(digits, shards):
    local, plan = fl.LocalTraining(epochs=2, batch=10, lr=0.1), fl.Federation(3, 0.5, seed=4)
    alone = fl.federated(digits, shards, local, plan)
    ranks = launch(fl.federated, 2, args=(digits, shards, local, plan))
    for result in ranks:
        torch.testing.assert_close(result["params"], alone["params"], atol=1e-6, rtol=0)
    assert ranks[0]["accuracy"] == pytest.approx(alone["accuracy"])


def test_scaffold_and_server_optimisers_agree_across_processes_too(digits, shards):
    local = fl.LocalTraining(epochs=1, batch=10, lr=0.1)
    plan = fl.Federation(rounds=2, fraction=0.5, seed=1, scaffold=True,
                         server=fl.fedadam_server(lr=0.01))
    alone = fl.federated(digits, shards, local, plan)
    ranks = launch(fl.federated, 2, args=(digits, shards, local, plan))
    torch.testing.assert_close(ranks[1]["params"], alone["params"], atol=1e-6, rtol=0)


def test_fedavg_learns_and_reports_rounds_to_target(digits):
    parts = pt.iid(digits.y_train.numpy(), 20)
    log = fl.federated(digits, parts, fl.LocalTraining(epochs=2, batch=10, lr=0.1),
                       fl.Federation(rounds=40, fraction=0.2, target=0.85))
    assert log["accuracy"][0] < 0.3 and log["best"][-1] >= 0.85
    assert log["rounds_to_target"] == len(log["accuracy"]) - 1  # it stopped at the target
    assert log["bytes_per_round"][0] == 2 * 4 * D * 4  # 4 clients, both ways


def test_rounds_to_target_reads_the_best_so_far_curve():
    assert fl.rounds_to_target([0.1, 0.5, 0.92, 0.88, 0.95], 0.9) == 2
    assert fl.rounds_to_target([0.1, 0.5], 0.9) is None


def test_dropped_stragglers_do_no_work_and_kept_ones_do_part(digits, shards):
    base = dict(rounds=1, fraction=1.0)
    all_slow_dropped = fl.federated(digits, shards, FEDSGD, fl.Federation(stragglers=1.0, **base))
    torch.testing.assert_close(all_slow_dropped["params"], DIGITS_MLP.init())  # nobody reported
    kept = fl.federated(digits, shards, FEDSGD,
                        fl.Federation(stragglers=1.0, keep_partial=True, **base))
    normal = fl.federated(digits, shards, FEDSGD, fl.Federation(**base))
    # one step is all a B=inf epoch has
    torch.testing.assert_close(kept["params"], normal["params"])


def test_straggler_budgets_are_seeded_and_within_the_local_steps(digits, shards):
    local = fl.LocalTraining(epochs=2, batch=10)
    chosen = list(range(10))
    clients = fl.Clients.of(digits, shards)
    budgets = fl.straggler_budgets(chosen, clients, local, 0.3, seed=5, round_=2)
    assert len(budgets) == 3 and set(budgets) <= set(chosen)
    assert all(1 <= steps <= local.steps(len(shards[k])) for k, steps in budgets.items())
    assert budgets == fl.straggler_budgets(chosen, clients, local, 0.3, seed=5, round_=2)
    assert fl.straggler_budgets(chosen, clients, local, 0.0, seed=5, round_=2) == {}


def test_fedprox_pulls_local_models_towards_the_global_one(digits):
    w = DIGITS_MLP.init()
    x, y = digits.x_train[:200].double(), digits.y_train[:200]
    local = fl.LocalTraining(epochs=5, batch=10, lr=0.1)
    free, _ = fl.client_update(w, x, y, local, seed=0)
    prox, _ = fl.client_update(w, x, y, fl.LocalTraining(epochs=5, batch=10, lr=0.1, mu=1.0), 0)
    assert (prox - w).norm() < (free - w).norm()
    _, steps = fl.client_update(w, x, y, local, seed=0, max_steps=7)
    assert steps == 7 and local.steps(200) == 100
    assert fl.LocalTraining(epochs=3, batch=None).steps(200) == 3


def test_server_optimisers_move_along_the_round_update():
    w, avg = torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    torch.testing.assert_close(fl.fedavg_server()(w, avg - w, {}), avg, rtol=0, atol=1e-12)
    momentum, state = fl.fedavgm_server(lr=0.5), {}
    first = momentum(w, avg - w, state)
    torch.testing.assert_close(first, w - 0.5 * (w - avg))
    second = momentum(first, avg - first, state)  # momentum: a bigger step
    assert (first - second).norm() > 0.5 * (first - avg).norm()
    torch.testing.assert_close(momentum(w, avg - w, {}), first)  # fresh state: same first step
    adam = fl.fedadam_server(lr=0.1)(w, avg - w, {})
    torch.testing.assert_close(adam, w - 0.1 * 0.1 / (0.1 + 1e-3), rtol=0, atol=1e-3)


def test_scaffold_control_variates_follow_option_two():
    cv = fl.ControlVariates(2, clients=4)
    w, v = torch.tensor([1.0, 1.0], dtype=torch.float64), torch.tensor([0.0, 2.0],
                                                                       dtype=torch.float64)
    torch.testing.assert_close(cv.correction(3), torch.zeros(2, dtype=torch.float64))
    cv.update(3, w, v, steps=2, lr=0.5)  # c_3 = 0 - 0 + (w - v) / (2 * 0.5)
    torch.testing.assert_close(cv.c_k[3], w - v)
    cv.end_round()  # c += (sum of changes) / K
    torch.testing.assert_close(cv.c, (w - v) / 4)
    torch.testing.assert_close(cv.correction(3), (w - v) / 4 - (w - v))


@pytest.mark.parametrize("settings, problem", [
    (dict(rounds=1, fraction=0), "fraction"), (dict(rounds=1, fraction=1.5), "fraction"),
    (dict(rounds=-1), "rounds"), (dict(rounds=2.5), "rounds"),
    (dict(rounds=1, stragglers=-0.1), "stragglers"), (dict(rounds=1, stragglers=2), "stragglers"),
    (dict(rounds=True), "rounds"), (dict(rounds=1, fraction="0.5"), "fraction must be a number"),
    (dict(rounds=1, stragglers=True), "stragglers must be a number")])
def test_bad_federations_are_refused_naming_the_setting(settings, problem):
    with pytest.raises(ValueError, match=problem):
        fl.Federation(**settings)


@pytest.mark.parametrize("settings, problem", [
    (dict(epochs=0), "epochs"), (dict(epochs=1.5), "epochs"), (dict(batch=0), "batch"),
    (dict(batch=-3), "batch"), (dict(lr=-1.0), "lr and mu"), (dict(lr=float("nan")), "lr and mu"),
    (dict(mu=-1.0), "lr and mu")])
def test_bad_local_training_is_refused_naming_the_setting(settings, problem):
    with pytest.raises(ValueError, match=problem):
        fl.LocalTraining(**settings)


def test_a_client_without_rows_is_refused_by_both_engines(digits):
    parts = [torch.arange(0, 10), torch.arange(10, 10)]
    for batched in (True, False):
        with pytest.raises(ValueError, match="holds no rows"):
            fl.federated(digits, parts, FEDSGD, fl.Federation(1, 1.0), batched=batched)


def test_a_federation_that_cannot_train_is_refused_naming_why(digits, shards):
    with pytest.raises(ValueError, match="SCAFFOLD's control variates divide by the local steps x "
                                         "lr: lr must be positive"):  # 0 / 0 otherwise: NaNs
        fl.federated(digits, shards, fl.LocalTraining(lr=0.0), fl.Federation(1, 0.5, scaffold=True))
    with pytest.raises(ValueError, match="parts is empty"):
        fl.federated(digits, [], FEDSGD, fl.Federation(1, 1.0))
    local = fl.LocalTraining(epochs=1, batch=10, lr=0.1)
    for edges, fraction, problem in (([[0, 1], [2, 99]], 0.5, "every edge lists one or more"),
                                     ([[0, 1], []], 0.5, "every edge lists"),
                                     ([], 0.5, "every edge lists"),
                                     ([[0, 1.5]], 0.5, "every edge lists"),
                                     ([[0, 1], [1, 2]], 0.5, r"client\(s\) \[1\] appear more "
                                                             r"than once in edges"),
                                     ([[0, 1]], 5.0, r"fraction C must be in \(0, 1\]")):
        with pytest.raises(ValueError, match=problem):
            fl.hierarchical(digits, shards, edges, local, cloud_rounds=1, edge_rounds=1,
                            fraction=fraction)


def test_numpy_edges_and_counts_work_and_impossible_ones_are_refused(digits, shards):
    local = fl.LocalTraining(epochs=1, batch=10, lr=0.1)
    as_lists = fl.hierarchical(digits, shards, [[0, 1], [2, 3]], local, cloud_rounds=1,
                               edge_rounds=1)
    as_arrays = fl.hierarchical(digits, shards, np.array_split(np.arange(4), 2), local,
                                cloud_rounds=np.int64(1), edge_rounds=1)
    assert as_lists == as_arrays
    with pytest.raises(ValueError, match="cloud_rounds must be a whole number of at least 0"):
        fl.hierarchical(digits, shards, [[0, 1]], local, cloud_rounds=-1, edge_rounds=1)
    with pytest.raises(ValueError, match="parts must hold at least one client"):
        fl.fedsgd_step(digits, [], None, 0.1)
    for seed in (-1, 1.5, True):
        with pytest.raises(ValueError, match="seed must be a whole number of at least 0"):
            fl.Federation(2, seed=seed)
    assert fl.Federation(np.int64(2), seed=np.int64(1)).rounds == 2


def test_clients_hand_out_each_clients_rows(digits, shards):
    clients = fl.Clients.of(digits, shards)
    assert len(clients) == len(shards) and clients.rows(3) == len(shards[3])
    x3, y3 = clients.data(3)
    torch.testing.assert_close(x3, digits.x_train[shards[3]].double())
    assert x3.dtype == torch.float64 and torch.equal(y3, digits.y_train[shards[3]])


def test_hierarchical_fedavg_learns_and_counts_both_kinds_of_links(digits):
    parts = pt.iid(digits.y_train.numpy(), 12)
    edges = [list(range(0, 6)), list(range(6, 12))]
    log = fl.hierarchical(digits, parts, edges, fl.LocalTraining(epochs=1, batch=10, lr=0.1),
                          cloud_rounds=4, edge_rounds=2, fraction=0.5)
    d = D
    assert len(log["accuracy"]) == 5 and log["accuracy"][-1] > log["accuracy"][0] + 0.3
    assert log["edge_to_cloud"] == 4 * 2 * 2 * d * 4
    assert log["client_to_edge"] == 4 * 2 * 2 * (2 * 3 * d * 4)


def test_a_round_on_ranks_equals_the_round_in_one_process(digits, shards):
    local, chosen = fl.LocalTraining(epochs=1, batch=10, lr=0.1), [0, 3, 4, 9, 12]
    clients = fl.Clients.of(digits, shards)

    def one_round(w):
        return fl.fedavg_round(w, clients, chosen, local, seed=2, round_=0)

    alone = one_round(DIGITS_MLP.init())
    ranks = launch(one_round, 2, args=(DIGITS_MLP.init(),))
    for result in ranks:
        torch.testing.assert_close(result, alone, atol=1e-10, rtol=0)
    assert fl.fedavg_round(DIGITS_MLP.init(), clients, [], local, seed=2, round_=0) is None


def test_sampled_clients_are_seeded_and_at_least_one():
    assert fl.sample_clients(100, 0.1, seed=3, round_=7) == fl.sample_clients(100, 0.1, 3, 7)
    assert len(fl.sample_clients(100, 0.1, 3, 7)) == 10
    assert len(fl.sample_clients(5, 0.01, 3, 7)) == 1
    assert fl.sample_clients(10, np.float32(0.5), 0, 0) == fl.sample_clients(10, 0.5, 0, 0)
    for fraction in (float("nan"), 1.5, -0.5, 0, "0.1"):  # -0.5 used to sample one client
        with pytest.raises(ValueError, match="fraction C must be a number in"):
            fl.sample_clients(10, fraction, 0, 0)
    assert fl.sample_clients(8, 0.5, 1, (2, 1, 0)) != fl.sample_clients(8, 0.5, 1, (2, 1, 1))
    assert fl.sample_clients(np.int64(4), 0.5, 0, 0) == fl.sample_clients(4, 0.5, 0, 0)
    for clients in (0, -3, 2.5, True):  # numpy's own error for 0, or a float sampled
        with pytest.raises(ValueError, match="clients must be a whole number of at least 1"):
            fl.sample_clients(clients, 0.5, 0, 0)
