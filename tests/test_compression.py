"""Gradient compression with error feedback (course_lib.compression): top-k, PowerSGD, and the
residual that error feedback keeps, on hand-made gradients and on two gloo ranks."""

import functools

import pytest
import torch

from course_lib import compression as cp
from course_lib import launch
from course_lib.data import load_digits
from course_lib.models import digits_mlp


def _reduce(name, grads_per_rank, feedback_steps=1):
    import torch.distributed as dist

    compressor = cp.compressor(name, seed=3)
    feedback = cp.ErrorFeedback()
    grads = grads_per_rank[dist.get_rank()]
    out = []
    for _ in range(feedback_steps):
        mean, n_bytes = cp.compressed_mean(compressor, feedback, grads)
        out.append(dict(mean=mean, bytes=n_bytes, residual=feedback.residual))
    return out


def test_error_feedback_keeps_exactly_what_top_k_did_not_send():
    g = [torch.tensor([[0.1, -5.0], [0.3, 2.0]]), torch.tensor([-4.0, 0.2])]
    result = launch(_reduce, 1, args=("top-k 50%", [g], 2))[0]
    # step 1 sends the 3 largest of 6 entries: -5, -4 and 2
    torch.testing.assert_close(result[0]["mean"][0], torch.tensor([[0.0, -5.0], [0.0, 2.0]]))
    torch.testing.assert_close(result[0]["residual"][0], torch.tensor([[0.1, 0.0], [0.3, 0.0]]))
    torch.testing.assert_close(result[0]["residual"][1], torch.tensor([0.0, 0.2]))
    assert result[0]["bytes"] == 3 * (4 + 4)  # float32 value + int32 index each
    # step 2: the same gradient plus the residual; the residual is again what was not sent
    corrected = [g[0] + result[0]["residual"][0], g[1] + result[0]["residual"][1]]
    sent = [m for m in result[1]["mean"]]
    for c, s, r in zip(corrected, sent, result[1]["residual"], strict=True):
        torch.testing.assert_close(r, c - s)


def test_top_k_mean_over_two_ranks_adds_the_entries_each_rank_kept():
    a = [torch.tensor([1.0, 0.0, 0.0, 8.0])]
    b = [torch.tensor([0.0, 6.0, 0.5, 2.0])]
    means = [r[0]["mean"][0] for r in launch(_reduce, 2, args=("top-k 25%", [a, b]))]
    for m in means:  # rank 0 sends 8 at index 3, rank 1 sends 6 at index 1
        torch.testing.assert_close(m, torch.tensor([0.0, 3.0, 0.0, 4.0]))


def test_top_k_of_a_model_without_entries_sends_nothing():
    assert cp.TopK(0.5).kept(torch.zeros(0)).numel() == 0  # topk(1) of nothing used to raise
    empty = [torch.zeros(0)]
    for r in launch(_reduce, 2, args=("top-k 25%", [empty, empty])):
        assert r[0]["mean"][0].shape == (0,) and r[0]["bytes"] == 0


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_powersgd_of_rank_r_is_exact_for_a_mean_of_rank_r(rank):
    g = torch.Generator().manual_seed(rank)
    u, v = torch.randn(12, rank, generator=g), torch.randn(rank, 7, generator=g)
    w = torch.randn(rank, rank, generator=g)  # the ranks' matrices differ; their mean is rank r
    grads = [[u @ w @ v, torch.randn(12, generator=g)], [u @ (2 - w) @ v, torch.zeros(12)]]
    results = launch(_reduce, 2, args=(f"PowerSGD rank {rank}", grads))
    mean = [(x + y) / 2 for x, y in zip(*grads, strict=True)]
    for r in results:
        torch.testing.assert_close(r[0]["mean"][0], mean[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(r[0]["mean"][1], mean[1])  # a vector goes dense
        assert r[0]["bytes"] == ((12 + 7) * rank + 12) * 4


def test_powersgd_of_a_full_rank_matrix_is_not_exact_and_feedback_keeps_the_rest():
    g = torch.Generator().manual_seed(0)
    m = [torch.randn(6, 5, generator=g)]
    r = launch(_reduce, 1, args=("PowerSGD rank 1", [m]))[0][0]
    assert (r["mean"][0] - m[0]).abs().max() > 0.1
    torch.testing.assert_close(r["residual"][0], m[0] - r["mean"][0])


def test_dense_compressor_equals_the_mean_and_leaves_no_residual():
    grads = [[torch.ones(3, 2)], [3 * torch.ones(3, 2)]]
    for r in launch(_reduce, 2, args=("dense", grads)):
        torch.testing.assert_close(r[0]["mean"][0], 2 * torch.ones(3, 2))
        torch.testing.assert_close(r[0]["residual"][0], torch.zeros(3, 2))
        assert r[0]["bytes"] == 6 * 4


@pytest.mark.parametrize("name", ["top-k 0%", "PowerSGD rank 0", "gzip"])
def test_bad_compressors_are_refused(name):
    with pytest.raises(ValueError):
        cp.compressor(name)


def test_training_of_no_steps_is_refused_not_divided_by_zero():
    split = load_digits(dtype=torch.float64)
    with pytest.raises(ValueError, match="steps must be a whole number of at least 1, got 0"):
        cp.train(digits_mlp, split.x_train, split.y_train, split.x_test, split.y_test, cp.Dense(),
                 False, 16, 0, 0.1)


def test_training_with_dense_compression_equals_one_process():
    split = load_digits(dtype=torch.float64)
    model_fn = functools.partial(digits_mlp, width=8, depth=1)

    def one_process():
        from course_lib import overlap

        fn = lambda: model_fn().double()  # noqa: E731
        return overlap.train_one_process(fn, split.x_train, split.y_train, 16, 5, 0.1)

    runs = launch(cp.train, 2, args=(lambda: model_fn().double(), split.x_train, split.y_train,
                                      split.x_test, split.y_test, cp.Dense(), False, 16, 5, 0.1))
    expected = one_process()["params"]
    for r in runs:
        torch.testing.assert_close(r["params"], expected, atol=1e-10, rtol=0)
        assert r["bytes"] == sum(p.numel() for p in model_fn().parameters()) * 8


def test_compare_runs_every_compressor_with_and_without_feedback():
    split = load_digits()
    model_fn = functools.partial(digits_mlp, width=8, depth=1)
    runs = launch(cp.compare, 2, args=(model_fn, split, ["dense", "top-k 10%"], [0, 1]),
                  kwargs=dict(steps=3))
    assert list(runs[0]) == ["dense", "top-k 10% + EF", "top-k 10% no EF"]
    for label, results in runs[0].items():
        assert len(results) == 2 and all(len(r["losses"]) == 3 for r in results), label
        assert all(0 <= r["accuracy"] <= 1 for r in results)
    assert runs[0]["top-k 10% + EF"][0]["bytes"] < runs[0]["dense"][0]["bytes"] / 4


def test_compressor_names_keep_their_digits_and_ranks_are_whole():
    assert cp.compressor("top-k 0.5%").name == "top-k 0.5%"  # it said "top-k 0%"
    assert cp.compressor("top-k 1%").name == "top-k 1%"
    for rank in (2.5, float("nan"), 0, True):
        with pytest.raises(ValueError, match="rank must be a whole number of at least 1"):
            cp.PowerSGD(rank)
    with pytest.raises(ValueError, match="unknown compressor 'PowerSGD rank 2.5'"):
        cp.compressor("PowerSGD rank 2.5")


@pytest.mark.parametrize("fraction", ["0.5", True, None])
def test_top_k_refuses_a_fraction_that_is_no_number(fraction):
    with pytest.raises(ValueError, match="fraction must be a number in"):
        cp.TopK(fraction)


def test_top_k_takes_any_number():
    from fractions import Fraction
    assert cp.TopK(Fraction(1, 100)).name == cp.TopK(torch.tensor(0.01)).name == "top-k 1%"
