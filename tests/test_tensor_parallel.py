"""Megatron tensor parallelism (course_lib.tensor_parallel) against the unsplit MLP."""

import pytest
import torch

from course_lib import launch
from course_lib import tensor_parallel as tp
from course_lib.models import feed_forward


@pytest.fixture(scope="module")
def problem():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 16, generator=g, dtype=torch.float64)
    return feed_forward(), x, torch.randn(6, 16, generator=g, dtype=torch.float64)


def reference(model, x, target):
    x = x.clone().requires_grad_(True)
    model.zero_grad()
    out = model(x)
    torch.nn.functional.mse_loss(out, target).backward()
    return out.detach(), x.grad, model


def test_megatron_mlp_on_two_ranks_equals_the_unsplit_mlp(problem):
    model, x, target = problem
    results = launch(tp.run_megatron_mlp, 2, args=(model, x, target))
    out, x_grad, full = reference(model, x, target)
    for rank, r in enumerate(results):
        torch.testing.assert_close(r["out"], out, atol=1e-6, rtol=0)
        torch.testing.assert_close(r["x_grad"], x_grad, atol=1e-6, rtol=0)
        rows = slice(rank * 32, (rank + 1) * 32)
        torch.testing.assert_close(r["grads"]["w1"], full.fc1.weight.grad[rows])
        torch.testing.assert_close(r["grads"]["b1"], full.fc1.bias.grad[rows])
        torch.testing.assert_close(r["grads"]["w2"], full.fc2.weight.grad[:, rows])
        torch.testing.assert_close(r["grads"]["b2"], full.fc2.bias.grad)


def test_one_all_reduce_per_forward_and_one_per_backward(problem):
    model, x, target = problem
    for r in launch(tp.run_megatron_mlp, 2, args=(model, x, target)):
        assert r["counter"] == {"forward": 1, "backward": 1}


def test_dtensor_colwise_rowwise_equals_the_unsplit_mlp(problem):
    model, x, _ = problem
    results = launch(tp.run_dtensor_mlp, 2, args=(model, x))
    for r in results:
        torch.testing.assert_close(r["out"], model(x).detach(), atol=1e-6, rtol=0)
        assert r["fc1_shard"] == (32, 16) and r["fc2_shard"] == (16, 32)


def test_shard_mlp_needs_an_even_split():
    with pytest.raises(ValueError, match="do not split evenly"):
        tp.shard_mlp(feed_forward(d_hidden=63), 0, 2)


def test_counter_starts_at_zero():
    assert tp.new_counter() == {"forward": 0, "backward": 0}


def test_hybrid_two_by_two_mesh_equals_the_unsplit_mlp_on_the_global_batch(problem):
    model, x, target = problem
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        results = launch(tp.run_hybrid_data_tensor, 4, args=(model, x, target))
    out, _, full = reference(model, x, target)
    for r in results:
        torch.testing.assert_close(r["out"], out.tensor_split(2)[r["dp_rank"]], atol=1e-6,
                                   rtol=0)
        rows = slice(r["tp_rank"] * 32, (r["tp_rank"] + 1) * 32)
        torch.testing.assert_close(r["grads"]["w1"], full.fc1.weight.grad[rows], atol=1e-6,
                                   rtol=0)
        torch.testing.assert_close(r["grads"]["w2"], full.fc2.weight.grad[:, rows], atol=1e-6,
                                   rtol=0)
    assert {(r["dp_rank"], r["tp_rank"]) for r in results} == {(0, 0), (0, 1), (1, 0), (1, 1)}
