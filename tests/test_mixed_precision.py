"""Mixed-precision training with torch.amp on the digits (course_lib.mixed_precision)."""

import pytest
import torch

from course_lib import mixed_precision as mp
from course_lib.data import load_digits
from course_lib.models import digits_mlp


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def test_autocast_runs_matrix_products_in_the_half_type_and_keeps_fp32_weights():
    model = digits_mlp(width=16)
    x = torch.randn(4, 64)
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16),
                             ("fp16 + loss scaling", torch.float16)):
        with mp.autocast(precision):
            assert model(x).dtype == dtype
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with pytest.raises(ValueError, match="unknown precision"):
        mp.autocast("fp64")


def test_bf16_and_scaled_fp16_train_as_well_as_fp32(digits):
    runs = {p: mp.train(digits, p, epochs=2) for p in mp.PRECISIONS[:3]}
    for p in ("bf16", "fp16 + loss scaling"):
        assert runs[p]["accuracy"][-1] == pytest.approx(runs["fp32"]["accuracy"][-1], abs=0.03)
    assert runs["fp32"]["accuracy"][-1] > 0.8 > runs["fp32"]["accuracy"][0]
    assert len(runs["fp16 + loss scaling"]["scale"]) == len(runs["fp32"]["losses"])


def test_a_tiny_loss_underflows_in_fp16_without_loss_scaling(digits):
    tiny = 2.0 ** -16  # the loss times 2^-16, the learning rate times 2^16: same in exact math
    fp32 = mp.train(digits, "fp32", epochs=2, loss_factor=tiny)
    unscaled = mp.train(digits, "fp16, no scaling", epochs=2, loss_factor=tiny)
    scaled = mp.train(digits, "fp16 + loss scaling", epochs=2, loss_factor=tiny)
    assert fp32["accuracy"][-1] == pytest.approx(mp.train(digits, "fp32", epochs=2)["accuracy"][-1],
                                             abs=0.01)
    assert unscaled["accuracy"][-1] < fp32["accuracy"][-1] - 0.3
    assert scaled["accuracy"][-1] == pytest.approx(fp32["accuracy"][-1], abs=0.03)


def test_gradient_values_are_the_weight_and_activation_gradients(digits):
    model = digits_mlp(width=16, depth=2)
    x, y = digits.x_train[:8], digits.y_train[:8]
    values = mp.gradient_values(model, x, y)
    assert values["weights"].numel() == sum(p.numel() for p in model.parameters())
    assert values["activations"].numel() == 8 * 16 * 2
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    torch.testing.assert_close(values["weights"][:16 * 64], model[0].weight.grad.flatten())
    assert len(model[1]._forward_hooks) == 0  # the hooks are removed
    model[0].weight.requires_grad_(False)  # frozen: no gradient, as the optimiser sees it
    frozen = mp.gradient_values(model, x, y)
    assert frozen["weights"].numel() == sum(p.numel() for p in model.parameters()) - 16 * 64
    tanh = torch.nn.Sequential(torch.nn.Linear(64, 10), torch.nn.Tanh())
    assert mp.gradient_values(tanh, x, y)["activations"].numel() == 0  # no ReLU to watch


class Nested(torch.nn.Module):  # not a Sequential, and its ReLU one level down
    def __init__(self, frozen_first=False):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 10)
        self.body[0].requires_grad_(not frozen_first)

    def forward(self, x):
        return self.head(self.body(x))


def test_gradient_values_find_relus_at_any_depth_and_skip_those_below_frozen_layers(digits):
    x, y = digits.x_train[:8], digits.y_train[:8]
    torch.manual_seed(0)
    nested = mp.gradient_values(Nested(), x, y)
    assert nested["activations"].numel() == 8 * 16
    frozen = Nested(frozen_first=True)  # no gradient reaches its ReLU: torch gives the head's
    values = mp.gradient_values(frozen, x, y)
    assert values["activations"].numel() == 0
    frozen.zero_grad()
    torch.nn.functional.cross_entropy(frozen(x), y).backward()
    torch.testing.assert_close(values["weights"], torch.cat([frozen.head.weight.grad.flatten(),
                                                             frozen.head.bias.grad]))


def test_training_that_would_take_no_step_or_divide_by_zero_is_refused(digits):
    with pytest.raises(ValueError, match=r"batch 100000 is larger than the \d+ training rows"):
        mp.train(digits, "fp32", epochs=1, batch=100_000)
    with pytest.raises(ValueError, match="batch must be a whole number of at least 1, got 0"):
        mp.train(digits, "fp32", epochs=1, batch=0)
    for epochs in (-1, 1.5):
        with pytest.raises(ValueError, match="epochs must be a whole number of at least 0"):
            mp.train(digits, "fp32", epochs=epochs)
    for factor in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="loss_factor must be positive and finite"):
            mp.train(digits, "fp32", epochs=1, loss_factor=factor)


def test_time_training_steps_measures_every_precision():
    precisions = ("fp32", "bf16", "fp16 + loss scaling")
    timings = mp.time_training_steps(precisions, width=32, depth=1, batch=8, repeats=2, warmup=1)
    assert list(timings) == list(precisions)
    assert all(len(t.times) == 2 and t.median > 0 for t in timings.values())


def test_training_step_updates_the_model_in_every_precision():
    for precision in ("fp32", "bf16", "fp16 + loss scaling"):
        torch.manual_seed(0)
        step = mp.training_step(precision, width=16, depth=1, batch=8)
        before = [p.detach().clone() for p in step.model.parameters()]
        step()
        after = list(step.model.parameters())
        assert all(p.dtype == torch.float32 for p in after)  # master weights stay fp32
        assert all(torch.isfinite(p).all() for p in after)
        assert any(not torch.allclose(a, b) for a, b in zip(after, before, strict=True)), precision
