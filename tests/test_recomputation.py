"""Activation recomputation (course_lib.recomputation) and the bytes it saves."""

import pytest
import torch

from course_lib import recomputation as rc
from course_lib.data import stdlib_text, text_batch
from course_lib.models import tiny_gpt


@pytest.fixture(scope="module")
def batch():
    return text_batch(stdlib_text(20_000), 3, 16, torch.Generator().manual_seed(0))


def _grads(checkpointing, x, y):
    model = tiny_gpt(d_model=32, layers=3, heads=4, context=16, seed=2, dtype=torch.float64)
    model.checkpointing = checkpointing
    rc.loss_fn(model, x, y).backward()
    return [p.grad for p in model.parameters()]


def test_recomputation_gives_the_same_gradients(batch):
    for a, b in zip(_grads(False, *batch), _grads(True, *batch), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_saved_activations_match_the_formula(batch, checkpointing):
    d, layers, heads = 32, 3, 4
    model = tiny_gpt(d_model=d, layers=layers, heads=heads, context=16)
    model.checkpointing = checkpointing
    x, y = batch
    measured = rc.saved_bytes(model, x, y)
    predicted = rc.activation_bytes(x.numel(), d, layers, heads, 96, checkpointing)
    assert abs(measured - predicted) <= 0.03 * predicted, (measured, predicted)


def test_peak_with_checkpointing_adds_one_block_and_is_below_the_full_peak():
    full = rc.peak_activation_bytes(256, 128, 4, 4, 96, False)
    kept = rc.activation_bytes(256, 128, 4, 4, 96, True)
    peak = rc.peak_activation_bytes(256, 128, 4, 4, 96, True)
    assert peak == kept + 256 * rc.block_activation_floats(128, 4) * 4
    assert kept < peak < full


def test_step_seconds_times_each_repeat(batch):
    model = tiny_gpt(d_model=16, layers=1, heads=2, context=16)
    times = rc.step_seconds(model, *batch, repeats=3, warmup=1)
    assert len(times) == 3 and all(t > 0 for t in times)


def test_peak_step_memory_falls_with_recomputation_and_its_activations_match_the_formula(batch):
    x, y = batch
    peaks = {}
    for checkpointing in (False, True):
        model = tiny_gpt(d_model=32, layers=3, heads=4, context=16)
        model.checkpointing = checkpointing
        peaks[checkpointing] = rc.peak_step_memory(model, x, y)
        assert peaks[checkpointing]["params"] == 4 * sum(p.numel() for p in model.parameters())
        assert all(p.grad is None for p in model.parameters())  # left as it was found
    full = peaks[False]["activations"] + peaks[False]["temporaries"]
    predicted = rc.peak_activation_bytes(x.numel(), 32, 3, 4, 96, False)
    assert abs(full - predicted) <= 0.25 * predicted, (full, predicted)
    assert peaks[True]["activations"] < peaks[False]["activations"] / 2
    assert peaks[True]["total"] < peaks[False]["total"]


@pytest.mark.parametrize("sizes, message", [
    (dict(tokens=-256), "tokens must be a whole number >= 0"),
    (dict(d_model=float("nan")), "d_model must be a whole number >= 1"),
    (dict(layers=-1), "layers must be a whole number >= 0"),
    (dict(heads=0), "heads must be a whole number >= 1"),
    (dict(vocab=96.5), "vocab must be a whole number >= 1"),
    (dict(element_size=-4), "element_size must be a whole number >= 1"),
    (dict(checkpointing="no"), "checkpointing is True or False, got 'no'")])
def test_activation_bytes_refuse_sizes_that_are_no_counts(sizes, message):
    # these used to give negative or NaN byte counts, and "no" counted as checkpointing
    args = dict(tokens=256, d_model=128, layers=4, heads=4, vocab=96) | sizes
    for formula in (rc.activation_bytes, rc.peak_activation_bytes):
        with pytest.raises(ValueError, match=message):
            formula(**args)


def test_block_activation_floats_refuse_negative_sizes_and_take_numpy_ints():
    import numpy as np

    with pytest.raises(ValueError, match="d_model must be a whole number >= 1"):
        rc.block_activation_floats(-128, 4)
    assert rc.block_activation_floats(np.int64(128), np.int64(4)) == 16 * 128 + 8
    assert rc.activation_bytes(np.int64(256), 128, 4, 4, 96) == rc.activation_bytes(256, 128, 4,
                                                                                    4, 96)
