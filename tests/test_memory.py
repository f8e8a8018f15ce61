"""Where the bytes of a training step go (course_lib.memory), counted and measured."""

import pytest
import torch

from course_lib import memory as M
from course_lib.data import stdlib_text, text_batch
from course_lib.models import tiny_gpt


def test_state_bytes_of_a_hand_sized_model():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))  # 8 parameters
    assert M.state_bytes(model) == dict(params=32, grads=32, optimizer=64, total=128)
    assert M.state_bytes(model, "mixed") == dict(params=16, grads=16, optimizer=96, total=128)
    with pytest.raises(ValueError, match="precision"):
        M.state_bytes(model, "fp8")


def test_a_frozen_parameter_is_held_but_has_no_gradient_or_moments():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))  # 8 + 3
    model[0].weight.requires_grad_(False)  # 6 frozen
    assert M.state_bytes(model) == dict(params=4 * 11, grads=4 * 5, optimizer=8 * 5,
                                        total=4 * 11 + 12 * 5)
    assert M.state_bytes(model, "mixed") == dict(params=2 * 11, grads=2 * 5, optimizer=12 * 5,
                                                 total=2 * 11 + 14 * 5)


def test_a_measured_adam_step_holds_what_was_counted():
    x, y = text_batch(stdlib_text(20_000), 3, 16, torch.Generator().manual_seed(0))
    model = tiny_gpt(d_model=32, layers=2, heads=4, context=16)
    counted = M.state_bytes(model)
    measured = M.measure_step(model, x, y)
    tensors = len(list(model.parameters()))
    assert measured["params"] == counted["params"]
    assert measured["grads"] == counted["grads"]
    assert measured["optimizer"] == counted["optimizer"] + 4 * tensors  # + a step count each
    assert measured["activations"] > 0
    assert measured["total"] == sum(v for k, v in measured.items() if k != "total")


def test_a_measured_mixed_precision_step_halves_weights_and_gradients():
    x, y = text_batch(stdlib_text(20_000), 3, 16, torch.Generator().manual_seed(0))
    model = tiny_gpt(d_model=32, layers=2, heads=4, context=16)
    counted = M.state_bytes(model, "mixed")
    before = [p.detach().clone() for p in model.parameters()]
    measured = M.measure_step(model, x, y, precision="mixed")
    for p, was in zip(model.parameters(), before, strict=True):  # it measured on a copy
        assert p.dtype == torch.float32 and torch.equal(p, was)
    assert measured["params"] == counted["params"] and measured["grads"] == counted["grads"]
    # masters and moments; the tracker also counts a little of Adam's working memory here
    assert counted["optimizer"] <= measured["optimizer"] <= 1.05 * counted["optimizer"]
    with pytest.raises(ValueError, match="precision"):
        M.measure_step(model, x, y, precision="fp8")


def test_a_mixed_step_takes_float_inputs_and_a_frozen_parameter_is_refused_by_name():
    from course_lib.models import digits_mlp

    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))  # float inputs, cast with the model
    mlp = digits_mlp(width=16, depth=1)
    counted, measured = M.state_bytes(mlp, "mixed"), M.measure_step(mlp, x, y, precision="mixed")
    assert measured["params"] == counted["params"] and measured["grads"] == counted["grads"]
    frozen = tiny_gpt(d_model=32, layers=2, heads=4, context=16)
    frozen.position.weight.requires_grad_(False)
    tokens, targets = text_batch(stdlib_text(20_000), 3, 16, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"cannot track frozen ones: \['position.weight'\]"):
        M.measure_step(frozen, tokens, targets)


def test_peak_bytes_is_the_most_held_at_once_not_the_sum():
    def one_after_another():
        for _ in range(3):
            a = torch.ones(1000, dtype=torch.float64)  # 8,000 bytes, freed before the next
            del a

    def all_at_once():
        return [torch.ones(1000, dtype=torch.float64) for _ in range(3)]

    inputs = torch.ones(10**5)  # the inputs are not counted
    assert M.peak_bytes(lambda x: x * 0, torch.zeros(1)) < 1000
    assert 8000 <= M.peak_bytes(one_after_another) < 16000
    assert 24000 <= M.peak_bytes(all_at_once) < 32000
    assert M.peak_bytes(lambda x: x.sum(), inputs) < 1000
