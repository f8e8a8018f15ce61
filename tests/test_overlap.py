"""Lesson 10's three hand-written synchronisations (course_lib.overlap) against one process on the
global batch and against DistributedDataParallel, on two gloo ranks in float64."""

import functools

import pytest
import torch

from course_lib import launch
from course_lib import overlap as ov
from course_lib.data import stdlib_text, text_batch
from course_lib.models import tiny_gpt

STEPS, LR, GLOBAL_BATCH = 3, 0.5, 8
model_fn = functools.partial(tiny_gpt, vocab=96, d_model=16, layers=2, heads=2, context=8,
                             seed=1, dtype=torch.float64)


@pytest.fixture(scope="module")
def text():
    x, y = text_batch(stdlib_text(20_000), 64, 8, torch.Generator().manual_seed(0))
    return x, y


def _all_syncs(x, y, bucket_mb):
    return {sync: ov.train(model_fn, x, y, GLOBAL_BATCH, STEPS, LR, sync=sync,
                           bucket_mb=bucket_mb)["params"] for sync in ov.SYNCS}


@pytest.mark.parametrize("bucket_mb", [0.004, 25.0], ids=["many buckets", "one bucket"])
def test_every_synchronisation_equals_one_process_and_ddp(text, bucket_mb):
    x, y = text
    results = launch(_all_syncs, 2, args=(x, y, bucket_mb))
    expected = ov.train_one_process(model_fn, x, y, GLOBAL_BATCH, STEPS, LR)["params"]
    for rank, result in enumerate(results):
        for sync in ov.SYNCS:
            torch.testing.assert_close(result[sync], expected, rtol=0, atol=1e-10,
                                       msg=lambda m, s=sync, r=rank: f"{s}, rank {r}: {m}")
        torch.testing.assert_close(result["buckets"], result["DDP"], rtol=0, atol=1e-10)
    assert not torch.allclose(expected, ov.parameters_vector(model_fn()))  # it did train


def frozen_model_fn():
    model = model_fn()
    model.embed.weight.requires_grad_(False)  # frozen: every synchronisation leaves it alone
    return model


def _all_syncs_frozen(x, y):
    return {sync: ov.train(frozen_model_fn, x, y, GLOBAL_BATCH, STEPS, LR, sync=sync,
                           bucket_mb=0.004)["params"] for sync in ov.SYNCS}


def test_a_frozen_parameter_trains_as_torch_sgd_would_under_every_synchronisation(text):
    x, y = text
    model = frozen_model_fn()  # torch's own: SGD skips a parameter without a gradient
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for idx in ov.global_batches(len(y), GLOBAL_BATCH, STEPS):
        opt.zero_grad()
        ov.loss_fn(model, x[idx], y[idx]).backward()
        opt.step()
    expected = ov.parameters_vector(model)
    torch.testing.assert_close(ov.train_one_process(frozen_model_fn, x, y, GLOBAL_BATCH, STEPS,
                                                    LR)["params"], expected, rtol=0, atol=1e-12)
    for rank, result in enumerate(launch(_all_syncs_frozen, 2, args=(x, y))):
        for sync in ov.SYNCS:
            torch.testing.assert_close(result[sync], expected, rtol=0, atol=1e-10,
                                       msg=lambda m, s=sync, r=rank: f"{s}, rank {r}: {m}")
    frozen = model_fn().embed.weight.flatten()
    assert torch.equal(expected[:frozen.numel()], frozen)  # the embedding never moved


def test_buckets_fill_in_reverse_order_and_hold_at_least_the_size():
    params = [torch.zeros(n) for n in (10, 300, 20, 262_144, 5)]  # float32: 4 bytes each
    assert ov.assign_buckets(params, 1.0) == [[4, 3], [2, 1, 0]]
    assert ov.assign_buckets(params, 1e-6) == [[4], [3], [2], [1], [0]]
    assert ov.assign_buckets(params, 100.0) == [[4, 3, 2, 1, 0]]
    with pytest.raises(ValueError, match="positive"):
        ov.assign_buckets(params, 0)


def _unused_parameter(sync):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    _, wait = ov.synchronizer(model, sync, bucket_mb=1e-6)
    model[0](torch.ones(1, 3)).sum().backward()  # the second layer gets no gradient
    try:
        wait()
    except RuntimeError as e:
        return str(e)
    return None


@pytest.mark.parametrize("sync", ["per parameter", "buckets"])
def test_a_parameter_without_gradient_is_named_not_hung(sync):
    messages = launch(_unused_parameter, 2, args=(sync,), timeout=60)
    assert all(m and "got no gradient" in m and "rank" in m for m in messages), messages


def test_uneven_global_batch_is_refused(text):
    x, y = text
    with pytest.raises(Exception, match="does not split evenly"):
        launch(ov.train, 2, args=(model_fn, x, y, 7, 1, LR))


def test_pack_bucket_flattens_in_order_and_divides_by_the_world_size_in_a_new_buffer():
    grads = [torch.arange(6.0).reshape(2, 3), torch.full((2,), 4.0)]
    buffer = ov.pack_bucket(grads, 4)
    torch.testing.assert_close(buffer, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.0, 1.0]))
    torch.testing.assert_close(grads[1], torch.full((2,), 4.0))  # the gradients are untouched
    ov.unpack_bucket(buffer, grads)
    torch.testing.assert_close(grads[0], torch.arange(6.0).reshape(2, 3) / 4)


def test_buckets_take_model_parameters_as_they_come_and_refuse_a_size_that_is_no_number():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    # a generator used to fail: "object of type 'generator' has no len()"
    assert ov.assign_buckets(model.parameters(), 25) == [[3, 2, 1, 0]]
    assert ov.assign_buckets(model.parameters(), 1e-6) == [[3], [2], [1], [0]]
    for bad in ("25", None, True, float("nan")):
        with pytest.raises(ValueError, match="bucket_mb must be positive, a number of megabytes"):
            ov.assign_buckets(model.parameters(), bad)


@pytest.mark.parametrize("grads, world_size", [([], 2), ([torch.ones(3)], 0),
                                               ([torch.ones(3)], -1), ([torch.ones(3)], 2.5)])
def test_pack_bucket_refuses_no_gradients_or_no_ranks(grads, world_size):
    # world_size 0 used to give a buffer of inf, [] a torch error
    with pytest.raises(ValueError, match="a bucket needs gradients and a world_size >= 1"):
        ov.pack_bucket(grads, world_size)


def _two_backwards_then_one(sync):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    _, wait = ov.synchronizer(model, sync, bucket_mb=1e-6)
    x = torch.ones(2, 3) * (1 + torch.distributed.get_rank())
    model(x).sum().backward()
    try:
        model(x).sum().backward()  # accumulating: a second pass into gradients being sent
        message = None
    except RuntimeError as e:
        message = str(e)
    wait()  # the first pass's all-reduces: every rank started the same ones, nothing added
    first = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()  # after wait() the next step works
    wait()
    return message, first, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("sync", ["per parameter", "buckets"])
def test_a_second_backward_before_wait_is_refused_not_summed_wrong(sync):
    results = launch(_two_backwards_then_one, 2, args=(sync,), timeout=60)
    assert all(m and "second backward() before wait()" in m for m, _, _ in results), results
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    for rank in (0, 1):
        model(torch.ones(2, 3) * (1 + rank)).sum().backward()
    for _, first, then in results:  # the refused pass added nothing; the next step is right
        for a, b, theirs in zip(first, then, model.parameters(), strict=True):
            torch.testing.assert_close(a, theirs.grad / 2)
            torch.testing.assert_close(b, theirs.grad / 2)
