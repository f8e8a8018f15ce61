"""FP8 training with delayed scaling (course_lib.fp8_training): the casts are torch's float8
casts with the history's scale, the layer's forward and backward are the FP8 products, and a
small network trains in FP8 about as well as in float32."""

import copy

import pytest
import torch

from course_lib import fp8_training as F
from course_lib.data import load_digits
from course_lib.models import digits_mlp


def test_a_cast_is_torchs_float8_cast_with_the_scale_of_the_amax_history():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, generator=g) * 3
    scaler = F.DelayedScaling(F.E4M3, history=2)
    s = 448 / x.abs().max().item()  # the first cast: its own amax
    expected = ((x.double() * s).to(torch.float8_e4m3fn).double() / s).float()
    assert torch.equal(scaler.cast(x), expected)  # torch's cast of x times the scale
    small = x / 100
    assert scaler.cast(small).ne(0).any() and scaler.scale() == pytest.approx(s)  # delayed
    scaler.cast(small)  # the large amax has left the history of two
    assert scaler.scale() == pytest.approx(448 / small.abs().max().item())
    halved = F.DelayedScaling(F.E5M2, margin=1)
    halved.cast(x)
    assert halved.scale() == pytest.approx(57344 / x.abs().max().item() / 2)
    assert scaler.saturated == halved.saturated == 0


def test_a_spike_beyond_the_history_saturates_and_is_counted():
    scaler = F.DelayedScaling(F.E4M3, history=4)
    scaler.cast(torch.ones(8))
    out = scaler.cast(torch.tensor([1.0, 10.0, -20.0]))
    assert scaler.saturated == 2 and out.tolist() == [1.0, 1.0, -1.0]  # clamped at 448 / 448
    assert scaler.scale() == pytest.approx(448 / 20)  # the spike is in the history now


def test_unscaled_casts_are_plain_float8_casts_and_flush_what_scaling_keeps():
    tiny = torch.full((16,), 1e-7) * torch.linspace(1, 2, 16)  # below e5m2's smallest subnormal
    plain = F.DelayedScaling(F.E5M2, scaled=False)
    assert torch.equal(plain.cast(tiny), tiny.to(torch.float8_e5m2).float())  # scale 1
    assert plain.scale() == 1.0 and plain.cast(tiny).eq(0).all()
    assert F.DelayedScaling(F.E5M2).cast(tiny).ne(0).all()  # scaled: every value kept
    layer = F.to_fp8_training(torch.nn.Linear(3, 4), scaled=False)
    assert all(not s.scaled for s in layer.scalers.values())


def test_the_layer_multiplies_fp8_inputs_forward_and_an_e5m2_gradient_backward():
    g = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(6, 4)
    layer = F.FP8Linear(linear)
    x = torch.randn(5, 6, generator=g, requires_grad=True)
    grad = torch.randn(5, 4, generator=g)
    y = layer(x)
    y.backward(grad)
    assert [s.dtype for s in layer.scalers.values()] == [F.E4M3, F.E4M3, F.E5M2]
    fresh = {name: F.DelayedScaling(s.dtype) for name, s in layer.scalers.items()}
    xq, wq = fresh["input"].cast(x), fresh["weight"].cast(linear.weight)
    torch.testing.assert_close(y, xq @ wq.T + linear.bias)
    gq = fresh["grad"].cast(grad)
    torch.testing.assert_close(x.grad, gq @ wq)
    torch.testing.assert_close(linear.weight.grad, gq.T @ xq)
    torch.testing.assert_close(linear.bias.grad, grad.sum(dim=0))  # the bias: float32
    assert not torch.equal(xq, x.detach())  # FP8 rounding happened


def test_a_network_trains_in_fp8_about_as_well_as_in_float32():
    split = load_digits()
    model = digits_mlp(width=32, depth=1, seed=0)
    fp8 = F.to_fp8_training(copy.deepcopy(model))
    assert sum(isinstance(m, F.FP8Linear) for m in fp8.modules()) == 2
    assert [p.data_ptr() for p in fp8.parameters()] != [p.data_ptr() for p in model.parameters()]

    def train(net):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(80):
            i = torch.randint(0, len(split.x_train), (64,), generator=g)
            loss = torch.nn.functional.cross_entropy(net(split.x_train[i]), split.y_train[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return sum(losses[-10:]) / 10, losses[0]

    (full, first), (low, _) = train(model), train(fp8)
    assert low < 0.5 * first and abs(low - full) < 0.1 * full + 0.02


def test_odd_tensors_neither_poison_the_history_nor_overflow_and_every_linear_is_swapped():
    scaler = F.DelayedScaling()
    scaler.cast(torch.tensor([1.0]))
    out = scaler.cast(torch.tensor([float("inf"), float("nan"), 1.0]))
    assert out[1].isnan() and out[2] == 1.0 and scaler.amaxes == [1.0, 1.0]  # inf/NaN skipped
    tiny = F.DelayedScaling().cast(torch.tensor([1e-38, 0.0, -5e-39]))
    assert torch.isfinite(tiny).all() and tiny[1] == 0
    assert isinstance(F.to_fp8_training(torch.nn.Linear(3, 4)), F.FP8Linear)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    F.to_fp8_training(layer)
    assert isinstance(layer.linear1, F.FP8Linear)
    assert isinstance(layer.self_attn.out_proj, torch.nn.Linear)  # attention reads it directly
    assert "in_features=3, out_features=4" in repr(F.to_fp8_training(torch.nn.Linear(3, 4)))


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="dtype must be torch.float8_e4m3fn or"):
        F.DelayedScaling(torch.bfloat16)
    with pytest.raises(ValueError, match="history must be a positive whole number"):
        F.DelayedScaling(history=0)
    for margin in (-1, 1100):
        with pytest.raises(ValueError, match="margin must be a whole number from 0 to 32"):
            F.DelayedScaling(margin=margin)
    with pytest.raises(ValueError, match="history must be a positive whole number"):
        F.to_fp8_training(torch.nn.ReLU(), history=0)
    empty = F.DelayedScaling()
    assert empty.cast(torch.zeros(3)).tolist() == [0.0] * 3 and empty.scale() == 1.0
