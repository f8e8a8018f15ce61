"""FSDP2 per-rank parameters against ZeRO stage 3 (course_lib.sharding)."""

import functools

import pytest
import torch

from course_lib import launch, sharding


def model_fn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def test_fully_shard_keeps_about_one_nth_of_the_parameters_per_rank():
    results = launch(sharding.fsdp_parameter_bytes, 2, args=(functools.partial(model_fn),))
    total = results[0]["total_bytes"]
    assert sum(r["local_bytes"] for r in results) == total  # every byte on exactly one rank
    for r in results:
        assert r["local_bytes"] == pytest.approx(total / 2, rel=0.05)
        assert r["grads_sharded"]


def frozen_model_fn():
    model = model_fn()
    model[2].bias.requires_grad_(False)  # frozen: no gradient, as in torch
    return model


def test_a_model_with_a_frozen_parameter_is_sharded_and_counted():
    results = launch(sharding.fsdp_parameter_bytes, 2, args=(frozen_model_fn,))
    assert sum(r["local_bytes"] for r in results) == results[0]["total_bytes"]
    assert all(r["grads_sharded"] for r in results)


def test_a_model_that_does_not_start_with_a_linear_takes_an_example_batch():
    from course_lib import WorkerError
    from course_lib.models import digits_cnn

    cnn = functools.partial(digits_cnn, seed=0, width=4)
    images = torch.randn(4, 1, 8, 8)
    results = launch(sharding.fsdp_parameter_bytes, 2, args=(cnn,), kwargs=dict(example=images))
    assert sum(r["local_bytes"] for r in results) == results[0]["total_bytes"]
    assert all(r["grads_sharded"] for r in results)
    with pytest.raises(WorkerError, match="give example=, an input batch for the model"):
        launch(sharding.fsdp_parameter_bytes, 2, args=(cnn,))


def test_local_bytes_counts_what_this_rank_holds():
    from course_lib.sharding import local_bytes

    tensors = [torch.zeros(3, 4), torch.zeros(5, dtype=torch.float64), None]
    assert local_bytes(tensors) == 12 * 4 + 5 * 8  # a missing gradient counts nothing
    assert local_bytes([]) == 0
