"""Megatron tensor parallelism (course_lib.tensor_parallel) against the unsplit MLP."""

import pytest
import torch

from course_lib import WorkerError, launch
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
    for rank, world_size in ((3, 2), (-1, 2), (0, 0)):  # an empty shard, or a division by 0
        with pytest.raises(ValueError, match="rank in 0..world_size - 1"):
            tp.shard_mlp(feed_forward(d_hidden=64), rank, world_size)


def test_frozen_and_missing_biases_behave_as_in_the_unsplit_mlp(problem):
    _, x, target = problem
    frozen = feed_forward()
    frozen.fc1.bias.requires_grad_(False)  # no gradient in torch: none in any shard either
    bare = feed_forward()
    bare.fc1, bare.fc2 = (torch.nn.Linear(16, 64, bias=False, dtype=torch.float64),
                          torch.nn.Linear(64, 16, bias=False, dtype=torch.float64))
    for model in (frozen, bare):
        out, x_grad, full = reference(model, x, target)
        for rank, r in enumerate(launch(tp.run_megatron_mlp, 2, args=(model, x, target))):
            torch.testing.assert_close(r["out"], out)
            torch.testing.assert_close(r["x_grad"], x_grad)
            rows = slice(rank * 32, (rank + 1) * 32)
            torch.testing.assert_close(r["grads"]["w1"], full.fc1.weight.grad[rows])
            torch.testing.assert_close(r["grads"]["w2"], full.fc2.weight.grad[:, rows])
            assert r["grads"]["b1"] is None and (r["grads"]["b2"] is None) == (model is bare)


@pytest.mark.parametrize("rank, tp_size", [(0, 0), (0, -2), (5, 2), (0, 2.0), (True, 2)])
def test_a_parallel_block_refuses_a_rank_outside_its_group(rank, tp_size):
    from course_lib.models import Block
    with pytest.raises(ValueError, match="rank in 0..world_size - 1"):
        tp.ParallelBlock(Block(16, 4), rank, tp_size)


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


def hybrid_on_a_two_by_one_mesh(model, x, target, group=None):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("data", "tensor"))
    return tp.run_hybrid_data_tensor(model, x, target, mesh)


def test_a_batch_the_replicas_cannot_share_evenly_is_refused(problem):
    model, x, target = problem  # 6 rows: 3 a replica; 5 rows would weigh some rows more
    results = launch(hybrid_on_a_two_by_one_mesh, 2, args=(model, x, target), backend="gloo")
    out, _, full = reference(model, x, target)
    torch.testing.assert_close(results[1]["grads"]["w1"], full.fc1.weight.grad, atol=1e-6, rtol=0)
    with pytest.raises(WorkerError, match="global_batch 5 does not split evenly over 2 ranks"):
        launch(hybrid_on_a_two_by_one_mesh, 2, args=(model, x[:5], target[:5]), backend="gloo")


def split_linear_layers(linear, x):
    """On each rank: the layer split by columns (outputs gathered) and by rows (x's columns
    split), and the input's gradient through the column split (f sums it)."""
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * 6 // p, (rank + 1) * 6 // p)
    counter = tp.new_counter()
    x = x.clone().requires_grad_(True)
    mine = tp.column_parallel(x, linear.weight[rows], linear.bias[rows], counter)
    gathered = [torch.empty_like(mine) for _ in range(p)]
    dist.all_gather(gathered, mine.detach())
    mine.sum().backward()
    cols = slice(rank * 8 // p, (rank + 1) * 8 // p)
    summed = tp.row_parallel(x.detach()[:, cols], linear.weight[:, cols], linear.bias, counter)
    return torch.cat(gathered, dim=1), summed.detach(), x.grad, counter


def test_column_and_row_parallel_layers_give_the_whole_layer(problem):
    linear = torch.nn.Linear(8, 6, dtype=torch.float64)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    whole = x.clone().requires_grad_(True)
    out = linear(whole)
    out.sum().backward()
    for gathered, summed, x_grad, counter in launch(split_linear_layers, 2, args=(linear, x)):
        torch.testing.assert_close(gathered, out.detach())  # the output units, side by side
        torch.testing.assert_close(summed, out.detach())  # the partial products, summed by g
        torch.testing.assert_close(x_grad, whole.grad)  # f summed the input's gradient
        assert counter == {"forward": 1, "backward": 1}
