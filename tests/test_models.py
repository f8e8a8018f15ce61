"""The course's networks (course_lib.models): shapes, seeds, and the flat MLP's backward pass."""

import pytest
import torch

from course_lib import models


def linear_outputs(model):
    return [m.out_features for m in model if isinstance(m, torch.nn.Linear)]


def test_mlp_has_the_sizes_and_activation_asked_for():
    model = models.mlp((5, 7, 3), activation=torch.nn.Tanh, dtype=torch.float64)
    assert [type(m) for m in model] == [torch.nn.Linear, torch.nn.Tanh, torch.nn.Linear]
    assert linear_outputs(model) == [7, 3] and model[0].weight.dtype == torch.float64
    assert isinstance(models.mlp((64, 10), flatten=True)[0], torch.nn.Flatten)
    with pytest.raises(ValueError, match="at least input and output"):
        models.mlp((5,))


def test_the_same_seed_builds_the_same_weights_in_any_process():
    for build in (lambda s: models.mlp((4, 8, 2), seed=s), lambda s: models.digits_cnn(seed=s),
                  lambda s: models.feed_forward(seed=s)):
        a, b, c = build(1), build(1), build(2)
        for pa, pb, pc in zip(a.parameters(), b.parameters(), c.parameters(), strict=True):
            torch.testing.assert_close(pa, pb)
            assert not torch.allclose(pa, pc)


def test_digits_mlp_and_deep_mlp_are_mlps_of_the_digits():
    assert linear_outputs(models.digits_mlp(width=32, depth=3)) == [32, 32, 32, 10]
    deep = models.deep_mlp(depth=10, width=16)
    assert len(list(deep.parameters())) == 20
    assert deep(torch.zeros(3, 1, 8, 8)).shape == (3, 10)


def test_digits_cnn_width_sets_the_channels():
    cnn = models.digits_cnn(width=8)
    assert cnn[2].out_channels == 16 and cnn(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    assert models.digits_cnn(dtype=torch.float64)[0].weight.dtype == torch.float64


def test_feed_forward_is_the_transformer_mlp_block():
    block = models.feed_forward(d_model=6, d_hidden=24)
    assert (block.fc1.in_features, block.fc1.out_features, block.fc2.out_features) == (6, 24, 6)
    assert isinstance(block.act, torch.nn.GELU)


def test_flat_mlp_gradient_equals_autograd():
    model, g = models.FlatMLP((64, 32, 10)), torch.Generator().manual_seed(0)
    w = model.init(seed=3)
    x = torch.randn(20, 64, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (20,), generator=g)
    loss, grad = model.loss_and_gradient(w, x, y)
    wt = w.clone().requires_grad_(True)
    reference = torch.nn.functional.cross_entropy(model.forward(wt, x), y)
    reference.backward()
    assert loss == pytest.approx(reference.item(), abs=1e-12)
    torch.testing.assert_close(grad, wt.grad, atol=1e-12, rtol=0)
    assert len(w) == model.num_parameters == 64 * 32 + 32 + 32 * 10 + 10


def test_flat_mlp_layers_are_views_into_the_vector_and_init_is_seeded():
    model = models.FlatMLP((3, 4, 2))
    w = model.init(seed=1)
    (w1, b1), (w2, b2) = model.layers(w)
    assert w1.shape == (4, 3) and b1.shape == (4,) and w2.shape == (2, 4) and b2.shape == (2,)
    w2[0, 0] = 42.0  # a view: writing it writes the flat vector
    assert w[3 * 4 + 4].item() == pytest.approx(42.0)
    torch.testing.assert_close(model.init(seed=1), models.FlatMLP((3, 4, 2)).init(seed=1))
    assert (model.init().abs() <= 1 / 3 ** 0.5).all()  # PyTorch's default bound for fan_in 3


def test_flat_mlp_accuracy_counts_correct_predictions():
    model = models.FlatMLP((2, 2))
    w = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)  # identity, no bias
    x = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, 4.0]], dtype=torch.float64)
    assert model.accuracy(w, x, torch.tensor([0, 1, 1])) == pytest.approx(2 / 3)


@pytest.mark.parametrize("call, match", [
    (lambda: models.FlatMLP((64,)), "two or more layer widths"),
    (lambda: models.FlatMLP((0, 10)), "two or more layer widths"),
    (lambda: models.DIGITS_MLP.forward(torch.zeros(5), torch.zeros(2, 64)),
     "flat vector of this MLP's 2410 parameters"),
    (lambda: models.DIGITS_MLP.loss_and_gradient(models.DIGITS_MLP.init(), torch.zeros(3, 64),
                                                  torch.tensor([1, 2])), "one label per row"),
    (lambda: models.DIGITS_MLP.loss_and_gradient(models.DIGITS_MLP.init(), torch.zeros(2, 64),
                                                  torch.tensor([1, -1])), "labels must lie in"),
    (lambda: models.DIGITS_MLP.loss_and_gradient(models.DIGITS_MLP.init(), torch.zeros(1, 64),
                                                  torch.tensor([10])), r"labels must lie in 0..9"),
    (lambda: models.digits_mlp(depth=-3), "depth must be a whole number of at least 0"),
    (lambda: models.digits_mlp(width=True), "width must be a whole number"),
    (lambda: models.deep_mlp(depth=0), "depth must be a whole number of at least 1"),
    (lambda: models.tiny_gpt(layers=-1), "layers must be a whole number"),
    (lambda: models.tiny_gpt(heads=0), "heads must be a whole number"),
    (lambda: models.tiny_gpt(heads=True), "heads must be a whole number")])
def test_models_refuse_sizes_weights_and_labels_that_do_not_fit_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()
    assert models.digits_mlp(depth=0)[0].out_features == 10  # no hidden layer: logistic regression
