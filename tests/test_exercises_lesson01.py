"""Lesson 1's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson01)."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_practice import graded_and_practice_draws

from course_lib import backprop as bp
from course_lib.exercises import common
from course_lib.exercises import lesson01 as ex

ROOT = Path(__file__).resolve().parents[1]


def right_leaky(dXp, Z):
    return torch.where(Z > 0, dXp, 0.1 * dXp)


def right_depthwise(dOut, X, K, stride, padding):
    batch, channels = X.shape[:2]
    k = K.shape[-1]
    cols = F.unfold(X, k, padding=padding, stride=stride).reshape(batch, channels, k * k, -1)
    return torch.einsum("bcl,bckl->ck", dOut.reshape(batch, channels, -1), cols).reshape(K.shape)


def test_leaky_relu_accepts_the_right_backward_and_rejects_relu_and_the_forward():
    assert "correct" in ex.check_leaky_relu_backward(right_leaky)
    with pytest.raises(common.ExerciseFailed, match="dQ/dZ is wrong"):
        ex.check_leaky_relu_backward(bp.relu_backward)  # forgot the slope
    with pytest.raises(common.ExerciseFailed, match="dQ/dZ is wrong"):  # sigma'(Z), no dXp
        ex.check_leaky_relu_backward(lambda dXp, Z: torch.where(Z > 0, 1.0, 0.1).double())
    with pytest.raises(common.ExerciseFailed, match="forget to return"):
        ex.check_leaky_relu_backward(lambda dXp, Z: None)


def test_depthwise_accepts_the_right_gradient_and_rejects_mixed_channels_and_a_wrong_shape():
    assert "correct" in ex.check_depthwise_kernel_gradient(right_depthwise)

    def every_channel_every_kernel(dOut, X, K, stride, padding):  # the full conv's dK, summed
        full = bp.conv2d_backward(dOut, X, K.expand(K.shape[0], X.shape[1], *K.shape[2:]),
                                  stride, padding)[1]
        return full.sum(dim=1, keepdim=True)

    with pytest.raises(common.ExerciseFailed, match="dQ/dK is wrong for batch"):
        ex.check_depthwise_kernel_gradient(every_channel_every_kernel)
    with pytest.raises(common.ExerciseFailed, match="must have the shape"):
        ex.check_depthwise_kernel_gradient(
            lambda dOut, X, K, s, p: right_depthwise(dOut, X, K, s, p).squeeze(1))
    with pytest.raises(common.ExerciseFailed, match="dQ/dK is wrong"):  # forgot the batch sum
        ex.check_depthwise_kernel_gradient(
            lambda dOut, X, K, s, p: right_depthwise(dOut[:1], X[:1], K, s, p))


def counts(channels, hidden, batch):
    """Section 4's count written out: per image, conv C*64*9, linear 64C x hidden, hidden x 10;
    autograd's backward: dQ/dW of every layer, dQ/dX of the two linear layers only."""
    conv, fc = channels * 64 * 9, hidden * 64 * channels + 10 * hidden
    return batch * (conv + fc), batch * (conv + 2 * fc)


def drawn_module(channels, hidden):
    return bp.to_torch_module(bp.small_cnn(channels=channels, hidden=hidden))


@pytest.mark.parametrize("channels, hidden, batch", [(8, 32, 32), (2, 8, 8), (16, 64, 128),
                                                     (5, 41, 77)])
def test_backward_cost_accepts_the_counts_of_every_drawn_network(channels, hidden, batch):
    forward, backward = counts(channels, hidden, batch)
    verdict = ex.check_backward_cost(forward, backward, drawn_module(channels, hidden), batch,
                                     (1, 8, 8))
    assert f"{forward:,} multiply-adds forward, {backward:,} backward" in verdict


def test_backward_cost_draws_change_the_answer(monkeypatch):
    """The notebook draws within the check's ranges (the grader's runs from all of them, other
    runs one of the practice draws); the counts of the draws differ by a factor of about 100,
    and one run's counts are rejected for another draw."""
    notebook = json.loads((ROOT / "notebooks" / "01_backprop.ipynb").read_text())
    draw = next("".join(c["source"]) for c in notebook["cells"]
                if "COST_BATCH = " in "".join(c["source"]))
    assert 'drawn("lesson01.cost_sizes", draw_cost_sizes)' in draw and "seed(" not in draw
    sizes = graded_and_practice_draws(monkeypatch, "lesson01.cost_sizes", ex.draw_cost_sizes)
    assert len(sizes) > 100  # the grader's runs draw from the whole ranges
    for i, (lo, hi) in enumerate((ex.CHANNELS_RANGE, ex.HIDDEN_RANGE, ex.BATCH_RANGE)):
        assert {s[i] for s in sizes} <= set(range(lo, hi + 1))
    ranges = (ex.CHANNELS_RANGE, ex.HIDDEN_RANGE, ex.BATCH_RANGE)
    smallest, largest = counts(*(r[0] for r in ranges)), counts(*(r[1] for r in ranges))
    assert largest[0] > 100 * smallest[0]
    with pytest.raises(common.ExerciseFailed, match="larger than the run's"):
        ex.check_backward_cost(*counts(5, 41, 77), drawn_module(5, 40), 77, (1, 8, 8))


def test_backward_cost_explains_typical_mistakes():
    module, (c, h, n) = drawn_module(5, 41), (5, 41, 77)
    forward, backward = counts(c, h, n)
    conv, fc = c * 64 * 9, h * 64 * c + 10 * h  # per image
    check = lambda f, b: ex.check_backward_cost(f, b, module, n, (1, 8, 8))  # noqa: E731
    with pytest.raises(common.ExerciseFailed, match="counted flops"):
        check(2 * forward, backward)
    with pytest.raises(common.ExerciseFailed, match="per example"):
        check(conv + fc, backward)
    with pytest.raises(common.ExerciseFailed, match="hand-written backward"):
        check(forward, 2 * forward)
    with pytest.raises(common.ExerciseFailed, match="two products"):
        check(forward, forward)
    with pytest.raises(common.ExerciseFailed, match="whole number"):
        check(forward + 0.5, backward)
    with pytest.raises(common.ExerciseFailed, match="count layer by layer"):
        check(forward + 1, backward)
    # section 7's network (8 channels, 32 hidden) typed in instead of the drawn one
    for batch in (32, n):
        with pytest.raises(common.ExerciseFailed, match="section 7's network"):
            check(counts(8, 32, batch)[0], backward)
        with pytest.raises(common.ExerciseFailed, match="section 7's network"):
            check(forward, counts(8, 32, batch)[1])


def test_in_a_graded_run_the_sizes_must_be_the_ones_drawn_for_it(monkeypatch, tmp_path):
    """A student who overwrites the drawn sizes with a classmate's and types the classmate's
    counts is caught: the grader's judge draws the run's sizes again."""
    monkeypatch.setenv(common.GRADING_SEED, "7")
    c, h, n = common.drawn("lesson01.cost_sizes", ex.draw_cost_sizes)
    assert (c, h, n) == common.drawn("lesson01.cost_sizes", ex.draw_cost_sizes)  # the grader's
    assert "correct" in ex.check_backward_cost(*counts(c, h, n), drawn_module(c, h), n, (1, 8, 8))
    nxt = lambda v, lo, hi: lo + (v - lo + 1) % (hi - lo + 1)  # noqa: E731  (another draw)
    others = [(nxt(c, *ex.CHANNELS_RANGE), h, n), (c, nxt(h, *ex.HIDDEN_RANGE), n),
              (c, h, nxt(n, *ex.BATCH_RANGE))]
    for oc, oh, on in others:
        with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
            ex.check_backward_cost(*counts(oc, oh, on), drawn_module(oc, oh), on, (1, 8, 8))
    with pytest.raises(common.ExerciseFailed, match="cost_module"):  # another network
        ex.check_backward_cost(*counts(c, h, n), bp.to_torch_module(bp.small_cnn(channels=c,
                               hidden=h)).append(torch.nn.Tanh()), n, (1, 8, 8))
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))  # the grader judges the data itself
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):  # the kernel's
        ex.check_backward_cost(*counts(*others[0]), drawn_module(*others[0][:2]), others[0][2],
                               (1, 8, 8))
    written = next(tmp_path.iterdir())
    with pytest.raises(common.ExerciseFailed, match="drawn values were changed"):
        common.JUDGES["lesson01.backward_cost"](common.from_plain(json.loads(written.read_text())))
    monkeypatch.delenv(common.GRADING_SEED)  # outside a graded run any sizes are checked as is
    monkeypatch.delenv(common.GRADING_OUT)
    assert "correct" in ex.check_backward_cost(*counts(*others[0]), drawn_module(*others[0][:2]),
                                               others[0][2], (1, 8, 8))


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(dOut, X, K, stride, padding):  # right for the visible ones
        dK = right_depthwise(dOut, X, K, stride, padding)
        return dK if (X.shape[1], K.shape[-1]) in {(1, 3), (3, 3), (2, 2)} else dK + 1

    def leaky_right_on_visible_only(dXp, Z):  # right for the visible shapes only
        visible = tuple(Z.shape) in {(1, 4), (5, 3), (2, 3, 4)}
        return right_leaky(dXp, Z) if visible else right_leaky(dXp, Z) * 2

    assert "correct" in ex.check_depthwise_kernel_gradient(right_on_visible_only)
    assert "correct" in ex.check_leaky_relu_backward(leaky_right_on_visible_only)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")
    with pytest.raises(common.HiddenTestFailed):
        ex.check_depthwise_kernel_gradient(right_on_visible_only)
    with pytest.raises(common.HiddenTestFailed):
        ex.check_leaky_relu_backward(leaky_right_on_visible_only)
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))  # the grader's kernel: to a file
    assert "recorded" in ex.check_depthwise_kernel_gradient(right_on_visible_only)
    assert "recorded" in ex.check_leaky_relu_backward(leaky_right_on_visible_only)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "000-lesson01.depthwise_kernel_gradient.json", "001-lesson01.leaky_relu_backward.json"]
