"""Hand-written backward passes (course_lib.backprop) against autograd and finite differences."""

import pytest
import torch
import torch.nn.functional as F

from course_lib import backprop as bp
from course_lib.data import load_digits

TOL = 1e-10  # float64: hand-written and autograd gradients agree to rounding


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def autograd_grads(forward, *inputs, upstream):
    """Gradients of sum(forward(*inputs) * upstream) with respect to each input."""
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    (forward(*leaves) * upstream).sum().backward()
    return [leaf.grad for leaf in leaves]


def assert_close_tight(a, b):
    assert (a - b).abs().max().item() <= TOL


@pytest.mark.parametrize("batch, d_in, d_out", [(1, 3, 5), (4, 7, 2), (9, 16, 16), (2, 1, 8)])
def test_linear_backward_matches_autograd(batch, d_in, d_out):
    X, W, b = randn(batch, d_in), randn(d_out, d_in), randn(d_out)
    dZ = randn(batch, d_out)
    hand = bp.linear_backward(dZ, X, W)
    auto = autograd_grads(bp.linear_forward, X, W, b, upstream=dZ)
    for h, a in zip(hand, auto, strict=True):
        assert_close_tight(h, a)


@pytest.mark.parametrize("name", ["relu", "sigmoid", "tanh"])
@pytest.mark.parametrize("shape", [(1, 5), (6, 3)])
def test_activation_backward_matches_autograd(name, shape):
    forward, backward = bp.Activation.PAIRS[name]
    Z, dXp = randn(shape), randn(shape)
    assert_close_tight(backward(dXp, Z), autograd_grads(forward, Z, upstream=dXp)[0])


@pytest.mark.parametrize("batch, classes", [(1, 3), (7, 10)])
def test_softmax_cross_entropy_backward_matches_autograd(batch, classes):
    Z, y = randn(batch, classes) * 3, torch.randint(0, classes, (batch,))
    auto = autograd_grads(lambda z: bp.softmax_cross_entropy_forward(z, y), Z,
                          upstream=torch.tensor(1.0, dtype=torch.float64))[0]
    assert_close_tight(bp.softmax_cross_entropy_backward(Z, y), auto)
    torch.testing.assert_close(bp.softmax_cross_entropy_forward(Z, y),
                               torch.nn.functional.cross_entropy(Z, y))


CONV_CASES = [  # batch, c_in, c_out, H, W, kernel, stride, padding
    (1, 1, 1, 5, 5, 3, 1, 0), (2, 3, 4, 7, 6, 3, 2, 1), (3, 2, 5, 8, 8, 2, 2, 0),
    (1, 4, 2, 6, 9, 3, 1, 2), (2, 1, 3, 5, 7, 1, 3, 1)]


@pytest.mark.parametrize("batch, c_in, c_out, H, W, k, stride, padding", CONV_CASES)
def test_conv2d_forward_matches_torch(batch, c_in, c_out, H, W, k, stride, padding):
    X, K, b = randn(batch, c_in, H, W), randn(c_out, c_in, k, k), randn(c_out)
    assert_close_tight(bp.conv2d_forward(X, K, b, stride, padding),
                       torch.nn.functional.conv2d(X, K, b, stride=stride, padding=padding))


@pytest.mark.parametrize("batch, c_in, c_out, H, W, k, stride, padding", CONV_CASES)
def test_conv2d_backward_matches_autograd(batch, c_in, c_out, H, W, k, stride, padding):
    X, K, b = randn(batch, c_in, H, W), randn(c_out, c_in, k, k), randn(c_out)
    dOut = torch.randn_like(bp.conv2d_forward(X, K, b, stride, padding))
    hand = bp.conv2d_backward(dOut, X, K, stride, padding)
    auto = autograd_grads(lambda x, kk, bb: torch.nn.functional.conv2d(
        x, kk, bb, stride=stride, padding=padding), X, K, b, upstream=dOut)
    for h, a in zip(hand, auto, strict=True):
        assert_close_tight(h, a)


def test_conv2d_backward_matches_finite_differences():
    X, K = randn(2, 2, 5, 5), randn(3, 2, 3, 3)
    dOut = torch.randn_like(bp.conv2d_forward(X, K, stride=2, padding=1))
    dX, dK, _ = bp.conv2d_backward(dOut, X, K, stride=2, padding=1)
    q = lambda x, k: (bp.conv2d_forward(x, k, stride=2, padding=1) * dOut).sum()  # noqa: E731
    torch.testing.assert_close(dX, bp.finite_difference_gradient(lambda x: q(x, K), X.clone()),
                               atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(dK, bp.finite_difference_gradient(lambda k: q(X, k), K.clone()),
                               atol=1e-6, rtol=1e-6)


def test_linear_and_loss_backward_match_finite_differences():
    X, W, y = randn(1, 4), randn(3, 4), torch.tensor([2])
    dZ = bp.softmax_cross_entropy_backward(bp.linear_forward(X, W), y)
    dX, dW, _ = bp.linear_backward(dZ, X, W)
    loss = lambda x, w: bp.softmax_cross_entropy_forward(bp.linear_forward(x, w), y)  # noqa: E731
    torch.testing.assert_close(dW, bp.finite_difference_gradient(lambda w: loss(X, w), W.clone()))
    torch.testing.assert_close(dX, bp.finite_difference_gradient(lambda x: loss(x, W), X.clone()))


def test_finite_difference_gradient_of_a_known_function():
    x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(bp.finite_difference_gradient(lambda v: (v**3).sum(), x), 3 * x**2)


def test_network_backward_equals_autograd_on_the_same_torch_module():
    net = bp.small_cnn(seed=1)
    module = bp.to_torch_module(net)
    split = load_digits(images=True, dtype=torch.float64)
    X, y = split.x_train[:16], split.y_train[:16]
    loss = net.loss(X, y)
    net.backward()
    auto_loss = torch.nn.functional.cross_entropy(module(X), y)
    auto_loss.backward()
    assert abs(loss.item() - auto_loss.item()) <= TOL
    for hand, p in zip(net.gradients(), module.parameters(), strict=True):
        assert_close_tight(hand, p.grad)


def test_hand_trained_network_reaches_95_percent_on_digits():
    split = load_digits(images=True, dtype=torch.float64)
    net = bp.small_cnn(seed=0)
    g = torch.Generator().manual_seed(0)
    for _ in range(15):
        for idx in torch.randperm(len(split.y_train), generator=g).split(32):
            net.loss(split.x_train[idx], split.y_train[idx])
            net.backward()
            for p, grad in zip(net.parameters(), net.gradients(), strict=True):
                p -= 0.1 * grad
    assert bp.accuracy(net.forward(split.x_test), split.y_test) >= 0.95


def test_unknown_activation():
    with pytest.raises(ValueError, match="unknown activation"):
        bp.Activation("gelu")


def test_accuracy():
    scores = torch.tensor([[0.0, 1.0], [2.0, 1.0]])
    assert bp.accuracy(scores, torch.tensor([1, 1])) == pytest.approx(0.5)


@pytest.mark.parametrize("name", ["relu", "sigmoid", "tanh"])
def test_activation_backward_matches_finite_differences(name):
    forward, backward = bp.Activation.PAIRS[name]
    Z, dXp = randn(3, 4), randn(3, 4)
    Z[Z.abs() < 1e-3] = 0.5  # keep ReLU's kink away from the finite-difference stencil
    fd = bp.finite_difference_gradient(lambda z: (forward(z) * dXp).sum(), Z.clone())
    torch.testing.assert_close(backward(dXp, Z), fd, atol=1e-7, rtol=1e-6)


def test_softmax_cross_entropy_backward_matches_finite_differences():
    Z, y = randn(2, 5), torch.tensor([4, 0])
    fd = bp.finite_difference_gradient(lambda z: bp.softmax_cross_entropy_forward(z, y), Z.clone())
    torch.testing.assert_close(bp.softmax_cross_entropy_backward(Z, y), fd, atol=1e-8, rtol=1e-6)


def test_small_cnn_is_made_of_the_hand_written_layers():
    net = bp.small_cnn(seed=0, channels=4, hidden=8)
    assert isinstance(net, bp.Network)
    assert net.forward(torch.zeros(3, 1, 8, 8, dtype=torch.float64)).shape == (3, 10)


@pytest.mark.parametrize("y", [torch.tensor([0, 1]), torch.tensor([0, 1, -1]),
                               torch.tensor([0, 1, 4]), torch.tensor([0.0, 1.0, 2.0]),
                               torch.tensor([True, False, True]), torch.tensor([[0], [1], [2]]),
                               torch.tensor([0, 1, 2], dtype=torch.int16)])
def test_cross_entropy_refuses_labels_that_torch_refuses(y):
    # a short y or a label of -1 used to give a wrong loss silently, the others raw IndexErrors
    # (int32 is the one dtype besides torch's int64 that we take: indexing takes it too)
    Z = randn(3, 4)
    with pytest.raises((RuntimeError, IndexError, ValueError)):
        torch.nn.functional.cross_entropy(Z, y)
    for loss_part in (bp.softmax_cross_entropy_forward, bp.softmax_cross_entropy_backward):
        with pytest.raises(ValueError, match=r"y must be one integer class label in \[0, 4\)"):
            loss_part(Z, y)


def test_cross_entropy_takes_int32_or_listed_labels_and_an_empty_batch():
    Z, y = randn(3, 4), torch.tensor([3, 0, 2])
    for labels in (y.int(), y.tolist()):
        torch.testing.assert_close(bp.softmax_cross_entropy_forward(Z, labels),
                                   torch.nn.functional.cross_entropy(Z, y))
    empty = bp.softmax_cross_entropy_forward(Z[:0], y[:0])
    assert empty.isnan() and torch.nn.functional.cross_entropy(Z[:0], y[:0]).isnan()


def test_finite_differences_nudge_a_contiguous_copy_of_any_float_x():
    x = randn(3, 2).T  # not contiguous: the nudges used to go to a copy, the gradient all zeros
    torch.testing.assert_close(bp.finite_difference_gradient(lambda v: (v**2).sum(), x), 2 * x)
    tracked = randn(4).requires_grad_(True)  # used to be an in-place error
    fd = bp.finite_difference_gradient(lambda v: (v**3).sum(), tracked)
    torch.testing.assert_close(fd, 3 * tracked.detach() ** 2)
    assert not fd.requires_grad and tracked.grad is None


@pytest.mark.parametrize("x, eps", [(torch.arange(3), 1e-6), (randn(3), 0.0), (randn(3), -1e-6),
                                    (randn(3), float("nan")), (randn(3), float("inf"))])
def test_finite_differences_refuse_integer_x_and_a_step_that_is_not_positive(x, eps):
    # an integer x gave garbage, eps = 0 a ZeroDivisionError
    with pytest.raises(ValueError, match="need a floating-point x and eps > 0, finite"):
        bp.finite_difference_gradient(lambda v: (v**2).sum(), x, eps)


def test_a_layer_with_no_inputs_starts_at_zero_as_torchs_does():
    layer, theirs = bp.Linear(0, 3), torch.nn.Linear(0, 3, dtype=torch.float64)
    X = torch.zeros(2, 0, dtype=torch.float64)
    torch.testing.assert_close(layer.forward(X), theirs(X))
    assert layer.W.shape == (3, 0) and not layer.b.any()


@pytest.mark.parametrize("shape, kernel, stride, padding, problem", [
    ((1, 1, 5, 5), (2, 3, 3, 3), 1, 0, "channels"),
    ((1, 1, 5, 5), (2, 1, 7, 7), 1, 0, "kernel larger than the image"),
    ((1, 1, 5, 5), (2, 1, 8, 8), 1, 1, "kernel larger than the padded image"),
    ((1, 1, 5, 5), (2, 1, 3, 3), 0, 0, "stride 0"),
    ((1, 1, 5, 5), (2, 1, 3, 3), 1, -1, "negative padding"),
    ((1, 5, 5), (2, 1, 3, 3), 1, 0, "no batch dimension (torch takes it unbatched)"),
])
def test_conv2d_refuses_bad_shapes_and_names_them(shape, kernel, stride, padding, problem):
    X, K = torch.zeros(shape, dtype=torch.float64), torch.zeros(kernel, dtype=torch.float64)
    if len(shape) == 4:
        with pytest.raises(RuntimeError):
            F.conv2d(X, K, stride=stride, padding=padding)
    with pytest.raises(ValueError, match=r"conv2d needs X .* got X \(.*kernel \(.*stride"):
        bp.conv2d_forward(X, K, stride=stride, padding=padding)


def test_conv2d_takes_a_kernel_the_size_of_the_padded_image():
    X = torch.randn(2, 1, 3, 3, dtype=torch.float64)
    K = torch.randn(4, 1, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(bp.conv2d_forward(X, K, padding=1), F.conv2d(X, K, padding=1))
