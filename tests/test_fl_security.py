"""Privacy and robustness in federated learning (course_lib.fl_security)."""

import functools

import pytest
import torch

from course_lib import federated as fl
from course_lib import fl_security as sec
from course_lib import partitions as pt
from course_lib.data import load_digits
from course_lib.models import DIGITS_MLP, mlp

LOCAL = fl.LocalTraining(epochs=2, batch=10)


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def test_a_least_squares_gradient_gives_the_input_back_exactly():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, generator=g, dtype=torch.float64), torch.randn(64, generator=g,
                                                                         dtype=torch.float64)
    grad_w, grad_b, x_hat = sec.least_squares_leak(x, 3.0, w, b=0.5)
    torch.testing.assert_close(x_hat, x)
    assert torch.nn.functional.cosine_similarity(grad_w, x, dim=0).abs() == pytest.approx(1)
    with pytest.raises(ValueError, match="residual .* is 0: the gradient is zero and leaks"):
        sec.least_squares_leak(torch.tensor([1.0, 2.0]), 3.0, torch.tensor([1.0, 1.0]))


def test_a_frozen_parameter_sends_no_gradient_and_the_attack_runs_on_the_rest():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    model[0].bias.requires_grad_(False)  # frozen: the client has no gradient of it to send
    grads = sec.shared_gradient(model, torch.randn(4), torch.tensor(1))
    assert [g.shape for g in grads] == [(3, 4), (2, 3), (2,)]
    assert sec.deep_leakage(model, grads, steps=2).shape == (4,)
    assert sec.infer_label(grads) == 1  # the true class: the last bias's negative entry
    model[2].bias.requires_grad_(False)  # the last bias, which the label is read from, frozen
    with pytest.raises(ValueError, match="last layer's bias gradient: is that bias frozen"):
        sec.infer_label(sec.shared_gradient(model, torch.randn(4), torch.tensor(1)))


def test_deep_leakage_reconstructs_a_digit_from_its_gradient(digits):
    model = mlp((64, 32, 10), activation=torch.nn.Sigmoid)  # DLG needs smooth units
    x, y = digits.x_test[0], digits.y_test[0]
    gradients = sec.shared_gradient(model, x, y)
    assert sec.infer_label(gradients) == y.item()
    x_hat = sec.deep_leakage(model, gradients, steps=100)
    assert sec.reconstruction_error(x_hat, x) < 0.05 * x.pow(2).mean().item()
    noisy = [sec.clip_and_noise(gr, clip=1e9, noise=0.0) + 0.01 * torch.randn_like(gr)
             for gr in gradients]
    assert sec.reconstruction_error(sec.deep_leakage(model, noisy, steps=100), x) > \
        sec.reconstruction_error(x_hat, x)


def test_deep_leakage_takes_the_inputs_width_from_the_model():
    model = mlp((10, 8, 3), activation=torch.nn.Sigmoid, dtype=torch.float64)  # not 64 wide
    x = torch.linspace(-1, 1, 10, dtype=torch.float64)
    x_hat = sec.deep_leakage(model, sec.shared_gradient(model, x, torch.tensor(2)), steps=50)
    assert x_hat.shape == (10,) and x_hat.dtype == torch.float64
    with pytest.raises(ValueError, match="first torch.nn.Linear, and this model has none"):
        sec.deep_leakage(torch.nn.Sequential(torch.nn.Tanh()), [torch.zeros(3)])


def test_clip_and_noise_bounds_the_norm_and_adds_the_stated_noise():
    update = torch.full((10_000,), 1.0, dtype=torch.float64)
    clipped = sec.clip_and_noise(update, clip=2.0, noise=0.0)
    assert clipped.norm().item() == pytest.approx(2.0)
    noisy = sec.clip_and_noise(update, clip=2.0, noise=0.5,
                               generator=torch.Generator().manual_seed(0))
    assert (noisy - clipped).std().item() == pytest.approx(1.0, rel=0.05)  # noise x clip
    small = torch.full((4,), 0.1, dtype=torch.float64)
    torch.testing.assert_close(sec.clip_and_noise(small, clip=2.0, noise=0.0), small)


def test_pairwise_masks_cancel_in_the_sum_and_hide_each_update():
    g = torch.Generator().manual_seed(1)
    updates = torch.randn(6, 50, generator=g, dtype=torch.float64)
    masks = sec.pairwise_masks(6, 50, seed=3)
    masked = updates + masks
    torch.testing.assert_close(masked.sum(dim=0), updates.sum(dim=0))  # the server's sum
    assert masks.sum(dim=0).abs().max() < 1e-9
    for i in range(6):  # what the server sees of one client is mostly mask
        assert (masked[i] - updates[i]).norm() > 100 * updates[i].norm()


def test_coordinate_median_and_trimmed_mean_ignore_outliers():
    updates = torch.tensor([[1.0, 2.0], [1.2, 2.2], [0.8, 1.8], [100.0, -100.0]])
    torch.testing.assert_close(sec.coordinate_median(updates), torch.tensor([1.1, 1.9]))
    odd = updates[:3]
    torch.testing.assert_close(sec.coordinate_median(odd), torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(sec.trimmed_mean(updates, trim=0.25), torch.tensor([1.1, 1.9]))
    torch.testing.assert_close(sec.mean(updates), updates.mean(dim=0))
    for trim in (0.5, -0.2, 1.0):  # -0.2 would average only the largest values
        with pytest.raises(ValueError, match="trim is the share cut from each end: from 0 to"):
            sec.trimmed_mean(updates, trim=trim)
    torch.testing.assert_close(sec.trimmed_mean(updates, trim=0.49), torch.tensor([1.1, 1.9]))
    for rule in (sec.mean, sec.coordinate_median, sec.trimmed_mean, sec.krum, sec.norm_check,
                 sec.dp_mean(1.0, 0.0)):  # no update, or not one row per client
        for bad in (torch.empty(0, 2), torch.ones(3)):
            with pytest.raises(ValueError, match="updates must be one row per client"):
                rule(bad)


def test_krum_picks_an_honest_update_and_norm_check_drops_the_boosted_one():
    honest = torch.tensor([[1.0, 0.0], [1.1, 0.1], [0.9, -0.1], [1.0, 0.1], [1.05, 0.0]])
    bad = torch.tensor([[-20.0, 30.0]])
    updates = torch.cat([honest, bad])
    chosen = sec.krum(updates, byzantine=1)
    assert any(torch.allclose(chosen, h, rtol=0, atol=1e-12) for h in honest)
    torch.testing.assert_close(sec.norm_check(updates), honest.mean(dim=0))
    torch.testing.assert_close(sec.norm_check(updates, factor=1.0),  # the median's half
                               updates[updates.norm(dim=1) <= updates.norm(dim=1).median()]
                               .mean(dim=0))
    for factor in (0.5, -1.0, float("nan")):  # 0.5 could keep no update: a NaN model
        with pytest.raises(ValueError, match="factor must be 1 or more"):
            sec.norm_check(updates, factor=factor)
    with pytest.raises(ValueError, match="n - f - 2"):
        sec.krum(updates[:3], byzantine=1)
    for f in (-5, 1.5, True):
        with pytest.raises(ValueError, match=r"byzantine \(f\) must be a whole number of at"):
            sec.krum(updates, byzantine=f)


def test_attacks_scale_or_flip_the_update():
    u = torch.tensor([1.0, -2.0])
    torch.testing.assert_close(sec.boost(u, 5.0), 5 * u)
    torch.testing.assert_close(sec.sign_flip(u, 5.0), -5 * u)
    assert sec.flip_labels(torch.tensor([0, 3, 9])).tolist() == [9, 6, 0]
    parts = [[0], [1], [2], [3]]
    assert len(sec.fraction_attackers(parts, 0.5)) == 2 and sec.fraction_attackers(parts, 0) == []
    for share in (1.5, -0.1):
        with pytest.raises(ValueError, match="share is a fraction of the clients, from 0 to 1"):
            sec.fraction_attackers(parts, share)


def test_median_resists_sign_flipping_attackers_that_break_the_mean(digits):
    parts = pt.iid(digits.y_train.numpy(), 20)
    attackers = sec.fraction_attackers(parts, 0.2)
    attack, plan = sec.Attack(attackers, poison_update=sec.sign_flip), fl.Federation(8, 0.5)
    mean = sec.simulate_federation(digits, parts, LOCAL, plan, aggregator=sec.mean, attack=attack)
    median = sec.simulate_federation(digits, parts, LOCAL, plan, aggregator=sec.coordinate_median,
                                     attack=attack)
    clean = sec.simulate_federation(digits, parts, LOCAL, plan)
    assert mean["accuracy"][-1] < 0.5 < median["accuracy"][-1]
    assert median["accuracy"][-1] > clean["accuracy"][-1] - 0.15


def test_label_flippers_train_on_flipped_labels_and_the_validation_check_runs(digits):
    parts = pt.iid(digits.y_train.numpy(), 10)
    validation = (digits.x_test[:100], digits.y_test[:100])
    check = functools.partial(sec.validation_check, validation=validation)
    log = sec.simulate_federation(digits, parts, LOCAL, fl.Federation(2, 0.5), aggregator=check,
                                  attack=sec.Attack((0, 1, 2), poison_labels=sec.flip_labels))
    assert len(log["accuracy"]) == 3 and log["params"].shape == (DIGITS_MLP.num_parameters,)
    w, local = DIGITS_MLP.init(), fl.LocalTraining(epochs=1)
    x, y = digits.x_train.double(), digits.y_train
    flipped = sec.client_updates(w, fl.Clients.of(digits, parts), [0], local, 0, 0,
                                 sec.Attack((0,), poison_labels=sec.flip_labels))
    by_hand = fl.client_update(w, x[parts[0]], 9 - y[parts[0]], local, [0, 0, 0])[0] - w
    torch.testing.assert_close(flipped[0], by_hand)


def test_dp_federated_trades_accuracy_for_noise(digits):
    parts = pt.iid(digits.y_train.numpy(), 20)
    plan = fl.Federation(rounds=10, fraction=0.5)
    quiet = sec.simulate_federation(digits, parts, LOCAL, plan, aggregator=sec.dp_mean(1.0, 0.0))
    loud = sec.simulate_federation(digits, parts, LOCAL, plan, aggregator=sec.dp_mean(1.0, 20.0))
    assert quiet["accuracy"][-1] > loud["accuracy"][-1] + 0.2


def test_dp_mean_clips_every_update_then_adds_the_stated_noise():
    updates = torch.tensor([[3.0, 4.0], [0.3, 0.4]], dtype=torch.float64)  # norms 5 and 0.5
    torch.testing.assert_close(sec.dp_mean(1.0, 0.0)(updates), torch.tensor(
        [[0.6, 0.8], [0.3, 0.4]], dtype=torch.float64).mean(dim=0))
    noisy = torch.stack([sec.dp_mean(1.0, 2.0, seed=s)(updates) for s in range(2000)])
    assert noisy.std(dim=0).mean().item() == pytest.approx(2.0 * 1.0 / 2, rel=0.05)
    aggregate, run_a, run_b = sec.dp_mean(1.0, 2.0, seed=3), {}, {}
    a = [aggregate(updates, None, run_a) for _ in range(2)]  # two rounds of one run
    b = [aggregate(updates, None, run_b) for _ in range(2)]  # the same aggregator, another run
    torch.testing.assert_close(a, b)  # the noise lives in each run's state: reuse is safe
    assert not torch.allclose(a[0], a[1])  # and every round draws fresh noise
    for clip, noise in ((-1.0, 0.0), (0.0, 1.0), (float("inf"), 0.0), (1.0, -0.5)):
        with pytest.raises(ValueError, match="clip must be positive and finite and noise zero"):
            sec.dp_mean(clip, noise)  # a negative clip would flip every update
        with pytest.raises(ValueError, match="clip must be positive and finite"):
            sec.clip_and_noise(updates[0], clip, noise)


def test_validation_check_drops_the_update_that_ruins_the_validation_accuracy(digits):
    w = DIGITS_MLP.init()
    x, y = digits.x_train[:300].double(), digits.y_train[:300]
    local = fl.LocalTraining(epochs=3, batch=10, lr=0.1)
    honest = [fl.client_update(w, x[i::3], y[i::3], local, seed=i)[0] - w for i in range(3)]
    poisoned = -10 * honest[0]
    updates = torch.stack([*honest, poisoned])
    validation = (digits.x_test[:200], digits.y_test[:200])
    torch.testing.assert_close(sec.validation_check(updates, w, validation=validation),
                               torch.stack(honest).mean(dim=0))
    with pytest.raises(ValueError, match="margin must be 0 or more"):
        sec.validation_check(updates, w, validation=validation, margin=-0.1)


@pytest.mark.parametrize("server", [None, fl.fedavgm_server(lr=0.5, momentum=0.9)],
                         ids=["FedAvg", "FedAvgM"])
def test_the_simulator_with_the_mean_is_lesson_8s_fedavg(digits, server):
    parts = list(torch.arange(600).split(30))  # equal sizes: FedAvg's weighted mean is the mean
    plan = fl.Federation(rounds=3, fraction=0.25, seed=7, server=server)
    simulated = sec.simulate_federation(digits, parts, LOCAL, plan)
    federated = fl.federated(digits, parts, LOCAL, plan)
    torch.testing.assert_close(simulated["params"], federated["params"], rtol=0, atol=1e-10)
    assert simulated["accuracy"] == pytest.approx(federated["accuracy"], abs=1e-12)


@pytest.mark.parametrize("setting", [dict(scaffold=True), dict(stragglers=0.5),
                                     dict(target=0.9)])
def test_the_simulator_refuses_what_only_lesson_8s_loop_does(digits, setting):
    parts = pt.iid(digits.y_train.numpy(), 10)
    with pytest.raises(ValueError, match="simulator runs plain rounds"):
        sec.simulate_federation(digits, parts, LOCAL, fl.Federation(rounds=1, **setting))


def test_an_attack_poisons_only_its_attackers():
    attack = sec.Attack((2,), poison_labels=sec.flip_labels, poison_update=sec.boost)
    y, u = torch.tensor([1, 8]), torch.tensor([1.0, -1.0])
    assert attack.labels(2, y).tolist() == [8, 1] and attack.labels(0, y) is y
    torch.testing.assert_close(attack.update(2, u), 10 * u)
    assert attack.update(1, u) is u and sec.Attack().labels(2, y) is y


@pytest.mark.parametrize("broken", [float("nan"), float("inf")])
def test_a_broken_update_is_left_out_by_the_robust_rules_not_chosen(broken):
    honest = torch.tensor([[1.0, 1.0], [1.1, 0.9], [0.9, 1.1], [1.0, 1.05], [1.0, 1.0]])
    updates = torch.cat([honest, torch.full((1, 2), broken)])
    for rule in (sec.krum, sec.norm_check, sec.coordinate_median, sec.trimmed_mean):
        out = rule(updates)
        assert torch.isfinite(out).all(), rule.__name__
        assert (out - honest.mean(dim=0)).abs().max() < 0.1, rule.__name__
    assert any(torch.equal(sec.krum(updates), u) for u in honest)  # one of the honest ones


def test_every_pair_has_its_own_mask_and_shapes_must_match():
    d = 4
    assert not torch.equal(sec.pair_mask(0, 1011, d), sec.pair_mask(1, 2, d))  # they were equal
    with pytest.raises(ValueError, match="mask of clients 0 <= i < j.*, got i=1, j=0"):
        sec.pair_mask(1, 0, d)
    assert sec.pairwise_masks(5, d).sum(dim=0).abs().max() < 1e-9  # the masks still cancel
    with pytest.raises(ValueError, match="shapes differ"):
        sec.reconstruction_error(torch.arange(4.0).reshape(4, 1), torch.arange(4.0))
