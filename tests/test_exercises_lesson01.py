"""Lesson 1's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson01)."""

import pytest
import torch
import torch.nn.functional as F

from course_lib import backprop as bp
from course_lib.exercises import common
from course_lib.exercises import lesson01 as ex
from course_lib.models import small_cnn


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


def test_backward_cost_accepts_the_counts_and_explains_typical_mistakes():
    module = bp.to_torch_module(small_cnn(seed=0))
    conv, fc = 8 * 64 * 9, 32 * 512 + 10 * 32  # per image
    forward, backward = 32 * (conv + fc), 32 * (conv + 2 * fc)
    assert "correct" in ex.check_backward_cost(forward, backward, module, 32, (1, 8, 8))
    with pytest.raises(common.ExerciseFailed, match="counted flops"):
        ex.check_backward_cost(2 * forward, backward, module, 32, (1, 8, 8))
    with pytest.raises(common.ExerciseFailed, match="per example"):
        ex.check_backward_cost(conv + fc, backward, module, 32, (1, 8, 8))
    with pytest.raises(common.ExerciseFailed, match="hand-written backward"):
        ex.check_backward_cost(forward, 2 * forward, module, 32, (1, 8, 8))
    with pytest.raises(common.ExerciseFailed, match="two products"):
        ex.check_backward_cost(forward, forward, module, 32, (1, 8, 8))
    with pytest.raises(common.ExerciseFailed, match="whole number"):
        ex.check_backward_cost(forward + 0.5, backward, module, 32, (1, 8, 8))
    # another batch, another count: the judge counts the run's network, not a constant
    assert "correct" in ex.check_backward_cost(2 * forward, 2 * backward, module, 64, (1, 8, 8))


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(dOut, X, K, stride, padding):  # right for the visible ones
        dK = right_depthwise(dOut, X, K, stride, padding)
        return dK if (X.shape[1], K.shape[-1]) in {(1, 3), (3, 3), (2, 2)} else dK + 1

    def leaky_right_on_visible_only(dXp, Z):  # right for the visible shapes only
        visible = tuple(Z.shape) in {(1, 4), (5, 3), (2, 3, 4)}
        return right_leaky(dXp, Z) if visible else right_leaky(dXp, Z) * 2

    assert "correct" in ex.check_depthwise_kernel_gradient(right_on_visible_only)
    assert "correct" in ex.check_leaky_relu_backward(leaky_right_on_visible_only)
    monkeypatch.setenv(common.GRADING_SEED, "12345")
    with pytest.raises(common.HiddenTestFailed):
        ex.check_depthwise_kernel_gradient(right_on_visible_only)
    with pytest.raises(common.HiddenTestFailed):
        ex.check_leaky_relu_backward(leaky_right_on_visible_only)
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))  # the grader's kernel: to a file
    assert "recorded" in ex.check_depthwise_kernel_gradient(right_on_visible_only)
    assert "recorded" in ex.check_leaky_relu_backward(leaky_right_on_visible_only)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "000-lesson01.depthwise_kernel_gradient.json", "001-lesson01.leaky_relu_backward.json"]
