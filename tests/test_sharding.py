"""ZeRO memory formulas and FSDP2 per-rank parameters (course_lib.sharding)."""

import functools

import pytest
import torch

from course_lib import launch, sharding


def test_zero_formulas_match_the_paper():
    psi, n = 7.5e9, 64  # the ZeRO paper's example: 7.5B parameters on 64 GPUs
    assert sharding.zero_bytes_per_rank(psi, n, 0) == pytest.approx(120e9)
    assert sharding.zero_bytes_per_rank(psi, n, 1) == pytest.approx(31.4e9, rel=1e-2)
    assert sharding.zero_bytes_per_rank(psi, n, 2) == pytest.approx(16.6e9, rel=1e-2)
    assert sharding.zero_bytes_per_rank(psi, n, 3) == pytest.approx(1.875e9)
    with pytest.raises(ValueError):
        sharding.zero_bytes_per_rank(psi, n, 4)


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
