"""ZeRO stages 1 and 2 by hand (course_lib.zero) against unsharded Adam on one process."""

import functools
import itertools

import pytest
import torch

from course_lib import WorkerError, launch
from course_lib import zero as Z
from course_lib.data import load_digits
from course_lib.models import digits_mlp

STEPS, LR, GLOBAL_BATCH = 5, 0.05, 16
# 775 parameters: an odd number, so the last shard is padded
model_fn = functools.partial(digits_mlp, width=9, depth=2)


def _double():
    return model_fn().double()


@pytest.fixture(scope="module")
def digits():
    split = load_digits(dtype=torch.float64)
    return split.x_train[:200], split.y_train[:200]


def _all_stages(x, y):
    return {stage: Z.train(_double, x, y, GLOBAL_BATCH, STEPS, LR, stage=stage)
            for stage in Z.STAGES}


def test_zero_1_and_2_take_the_steps_of_unsharded_adam(digits):
    x, y = digits
    ranks = launch(_all_stages, 2, args=(x, y))
    one = Z.train_one_process(_double, x, y, GLOBAL_BATCH, STEPS, LR)
    assert not torch.allclose(one["params"], Z.parameters_vector(_double()))  # it trained
    for rank, result in enumerate(ranks):
        for stage in Z.STAGES:
            torch.testing.assert_close(result[stage]["params"], one["params"], rtol=0,
                                       atol=1e-10, msg=lambda m, s=stage, r=rank:
                                       f"stage {s}, rank {r}: {m}")


def test_each_rank_holds_half_of_the_optimizer_state(digits):
    x, y = digits
    ranks = launch(_all_stages, 2, args=(x, y))
    sizes = [p.numel() for p in model_fn().parameters()]
    numel, ends = sum(sizes), list(itertools.accumulate(sizes))
    for rank, result in enumerate(ranks):
        # two float64 moments per parameter, and Adam's step count (a float32) per tensor
        assert result[0]["optimizer_bytes"] == 2 * numel * 8 + len(sizes) * 4
        start, end, _ = Z.shard_bounds(numel, 2, rank)
        # this rank's entries only, and a step count for each parameter's piece it holds
        pieces = sum(1 for e, n in zip(ends, sizes, strict=True) if e - n < end and e > start)
        for stage in (1, 2):
            assert result[stage]["optimizer_bytes"] == 2 * (end - start) * 8 + pieces * 4


@pytest.mark.parametrize(("numel", "p"), [(10, 2), (11, 2), (7, 3), (2, 4)])
def test_shards_cover_the_vector_once_and_have_one_size(numel, p):
    bounds = [Z.shard_bounds(numel, p, r) for r in range(p)]
    assert {size for _, _, size in bounds} == {-(-numel // p)}
    covered = [i for start, end, _ in bounds for i in range(start, end)]
    assert covered == list(range(numel))


def test_shards_of_no_ranks_or_of_a_rank_outside_them_are_refused():
    for args in ((10, 0, 0), (10, 2, 2), (10, 2, -1), (-1, 2, 0)):
        with pytest.raises(ValueError, match="world_size >= 1, 0 <= rank < world_size"):
            Z.shard_bounds(*args)


def test_a_stage_that_is_not_1_or_2_is_refused():
    with pytest.raises(WorkerError, match="ValueError: stage must be 1 or 2 .*stage 3"):
        launch(lambda: Z.ShardedAdam(model_fn().parameters(), stage=3), 1)
    with pytest.raises(WorkerError, match="ValueError: stage must be 1 or 2 .*got True"):
        launch(lambda: Z.ShardedAdam(model_fn().parameters(), stage=True), 1)  # True is not 1


def test_an_uneven_global_batch_is_refused(digits):
    x, y = digits
    with pytest.raises(WorkerError, match="does not split evenly"):
        launch(Z.train, 2, args=(_double, x, y, 15, 1))


class MixedDtypes(torch.nn.Module):
    """A float32 layer and a float64 bias of its own: Adam steps each in its dtype."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(64, 10)
        self.extra = torch.nn.Parameter(torch.zeros(10, dtype=torch.float64))

    def forward(self, x):
        return self.layer(x).double() + self.extra


def _mixed(x, y, stage, group=None):
    torch.manual_seed(0)
    model = MixedDtypes()
    opt = Z.ShardedAdam(model.parameters(), stage=stage, lr=1e-2, group=group)
    rank, size = torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[rank::size]), y[rank::size]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_parameters_of_two_dtypes_step_as_torch_adam_does_each_in_its_own(digits):
    x, y = digits[0][:16].float(), digits[1][:16]
    torch.manual_seed(0)
    model = MixedDtypes()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    for stage in (1, 2):
        for got in launch(_mixed, 2, args=(x, y, stage)):
            assert [p.dtype for p in got] == [p.dtype for p in model.parameters()]
            for mine, want in zip(got, model.parameters(), strict=True):
                torch.testing.assert_close(mine, want.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("args", [(10, 3, 0.5), (10, 2.5, 1), (10.5, 3, 1), (10, float("inf"), 1),
                                  (10, 2, True)])
def test_shard_bounds_refuses_what_is_not_a_whole_number(args):
    with pytest.raises(ValueError, match="need whole numbers"):
        Z.shard_bounds(*args)


def test_shard_bounds_takes_numpy_whole_numbers():
    import numpy as np
    assert Z.shard_bounds(np.int64(10), np.int64(3), np.int64(2)) == (8, 10, 4)
