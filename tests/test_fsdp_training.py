"""FSDP2 training (course_lib.sharding.train_fsdp) against Adam on one process, on 2 gloo ranks."""

import functools

import pytest
import torch

from course_lib import WorkerError, launch
from course_lib import sharding as S
from course_lib import zero as Z
from course_lib.data import stdlib_text, text_batch
from course_lib.models import tiny_gpt

model_fn = functools.partial(tiny_gpt, d_model=16, layers=2, heads=2, context=8, seed=3,
                             dtype=torch.float64)


@pytest.fixture(scope="module")
def text():
    return text_batch(stdlib_text(20_000), 64, 8, torch.Generator().manual_seed(1))


@pytest.mark.parametrize("reshard", [True, False], ids=["reshard after forward", "keep"])
def test_fsdp2_training_equals_adam_on_one_process(text, reshard):
    x, y = text
    ranks = launch(S.train_fsdp, 2, args=(model_fn, x, y, 8, 4),
                   kwargs=dict(reshard_after_forward=reshard))
    one = Z.train_one_process(model_fn, x, y, 8, 4)
    for result in ranks:
        # stated tolerance: float64, sums over the ranks taken in another order
        torch.testing.assert_close(result["params"], one["params"], rtol=0, atol=1e-9)
    losses = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"], strict=True)]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(one["losses"]), rtol=0,
                               atol=1e-9)


def test_each_rank_holds_about_half_of_parameters_gradients_and_optimizer_state(text):
    x, y = text
    ranks = launch(S.train_fsdp, 2, args=(model_fn, x, y, 8, 1))
    for kind in ("params", "grads", "optimizer"):
        together = sum(r["state"][kind] for r in ranks)
        whole = ranks[0]["unsharded"][kind]
        # each tensor is cut into 2 row shards; odd row counts pad at most one row per tensor
        assert whole <= together <= whole * 1.05, kind
        assert all(r["state"][kind] <= 0.55 * whole for r in ranks), kind


def test_an_uneven_global_batch_is_refused(text):
    x, y = text
    with pytest.raises(WorkerError, match="does not split evenly"):
        launch(S.train_fsdp, 2, args=(model_fn, x, y, 7, 1))


def _norms_whole(keep):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    model = S.fully_shard_blocks(model_fn(), DeviceMesh.from_group(
        torch.distributed.group.WORLD, "cpu"), keep_whole=keep)
    norms = S.whole_parameters(model, (torch.nn.LayerNorm,))
    return (sorted({isinstance(p, DTensor) for p in norms}),
            sorted({isinstance(p, DTensor) for p in model.parameters() if p not in norms}),
            sum(p.numel() for p in norms))


def test_norms_can_stay_whole_on_every_rank_and_training_still_equals_one_process(text):
    whole, rest, n = launch(_norms_whole, 2, args=((torch.nn.LayerNorm,),))[0]
    assert whole == [False] and rest == [True] and n == 5 * 2 * 16  # 5 norms, weight and bias
    assert launch(_norms_whole, 2, args=((),))[0][0] == [True]  # by default sharded too
    x, y = text
    ranks = launch(S.train_fsdp, 2, args=(model_fn, x, y, 8, 4),
                   kwargs=dict(keep_whole=(torch.nn.LayerNorm,)))
    one = Z.train_one_process(model_fn, x, y, 8, 4)
    for result in ranks:  # the kept norms' gradients averaged by hand, the rest by FSDP
        torch.testing.assert_close(result["params"], one["params"], rtol=0, atol=1e-9)
