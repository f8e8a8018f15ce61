"""Data parallelism from scratch and with DDP (course_lib.data_parallel) against one process."""

import functools

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DistributedSampler, TensorDataset

from course_lib import data_parallel as dp
from course_lib import launch
from course_lib.data import load_digits
from course_lib.models import digits_cnn

LR, LOCAL_BATCH, N = 0.1, 16, 256


@pytest.fixture(scope="module")
def digits():
    split = load_digits(images=True, dtype=torch.float64)
    return split.x_train[:N], split.y_train[:N]


model_fn = functools.partial(digits_cnn, seed=3, width=4, dtype=torch.float64)


def baseline(x, y, world_size, local_batch, epochs=1):
    model = model_fn()
    for epoch in range(epochs):
        batches = dp.sampler_global_batches(len(y), world_size, local_batch, seed=0, epoch=epoch)
        dp.train_one_process(model, x, y, batches, LR)
    return dp.parameters_vector(model)


@pytest.mark.parametrize("world_size", [2, 3])
def test_sampler_global_batches_are_what_distributed_sampler_deals_out(world_size):
    dataset = TensorDataset(torch.arange(50))
    local = [list(DistributedSampler(dataset, world_size, r, shuffle=True, seed=7,
                                     drop_last=True)) for r in range(world_size)]
    for t, block in enumerate(dp.sampler_global_batches(50, world_size, 4, seed=7)):
        dealt = sorted(i for r in range(world_size) for i in local[r][4 * t:4 * (t + 1)])
        assert dealt == sorted(block.tolist())


@pytest.mark.parametrize("train", [dp.train_from_scratch, dp.train_ddp],
                         ids=["from scratch", "DDP"])
def test_data_parallelism_equals_one_process_on_the_global_batch(digits, train):
    x, y = digits
    results = launch(train, 2, args=(model_fn, x, y, LOCAL_BATCH, LR), kwargs=dict(epochs=2))
    expected = baseline(x, y, 2, LOCAL_BATCH, epochs=2)
    for r in results:
        torch.testing.assert_close(r["params"], expected, atol=1e-6, rtol=0)


def test_accumulation_with_no_sync_equals_the_larger_batch(digits):
    x, y = digits
    results = launch(dp.train_ddp, 2, args=(model_fn, x, y, LOCAL_BATCH, LR),
                     kwargs=dict(accumulate=2))
    expected = baseline(x, y, 2, 2 * LOCAL_BATCH)  # twice the batch, half the steps
    torch.testing.assert_close(results[0]["params"], expected, atol=1e-6, rtol=0)


def compressed_runs(x, y):
    logs = {}
    out = {}
    for name, dtype in (("float32", None), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        logs[name] = []
        out[name] = dp.train_ddp(model_fn, x, y, LOCAL_BATCH, LR,
                                 comm_hook=dp.compression_hook(dtype, logs[name]))["params"]
    out["torch fp16"] = dp.train_ddp(model_fn, x, y, LOCAL_BATCH, LR,
                                     comm_hook=default_hooks.fp16_compress_hook)["params"]
    out["plain"] = dp.train_ddp(model_fn, x, y, LOCAL_BATCH, LR)["params"]
    return out, {k: sum(v) for k, v in logs.items()}


def test_compression_hooks_halve_the_bytes_and_match_torchs_hook(digits):
    x, y = digits
    results = launch(compressed_runs, 2, args=(x, y))
    params, sent = results[0]
    assert sent["fp16"] * 4 == sent["float32"]  # float64 model: 8 bytes -> 2
    assert sent["bf16"] == sent["fp16"]
    torch.testing.assert_close(params["float32"], params["plain"], atol=1e-12, rtol=0)
    torch.testing.assert_close(params["fp16"], params["torch fp16"], atol=1e-12, rtol=0)
    assert (params["fp16"] - params["plain"]).abs().max() < 1e-2  # rounding, not divergence


@pytest.mark.parametrize("dtype", [torch.int8, "fp16", torch.bool, 16])
def test_a_compression_hook_in_a_dtype_that_cannot_carry_gradients_is_refused(dtype):
    with pytest.raises(ValueError, match="compression_hook sends the gradients in a floating"):
        dp.compression_hook(dtype)


def test_time_ddp_steps_times_both_modes(digits):
    x, y = digits
    times = launch(dp.time_ddp_steps, 2, args=(model_fn, x, y, 8), kwargs=dict(steps=3))
    assert all(len(t["with_sync"]) == 3 and len(t["no_sync"]) == 3 for t in times)


def test_time_ddp_steps_refuses_steps_it_cannot_time(digits):
    from course_lib.runtime.emulation import EmulatedDevice

    x, y = digits
    with pytest.raises(ValueError, match="steps must be a whole number of at least 1"):
        dp.time_ddp_steps(model_fn, x, y, 8, steps=0)
    with pytest.raises(ValueError, match="local_batch must be a whole number of at least 1"):
        dp.time_ddp_steps(model_fn, x, y, 0)
    # an emulated device's first step counts FLOPs and is not paced: it must not be timed
    with pytest.raises(ValueError, match="first step counts FLOPs"):
        dp.time_ddp_steps(model_fn, x, y, 8, warmup=0, emulated=EmulatedDevice(1e9))


def test_linear_scaling_rule_and_warmup():
    assert dp.linear_scaling_lr(0.1, 32, 256) == pytest.approx(0.8)
    assert dp.warmup_lr(0, 0.8, 10, 0.1) == pytest.approx(0.1)
    assert dp.warmup_lr(5, 0.8, 10, 0.1) == pytest.approx(0.45)
    assert dp.warmup_lr(10, 0.8, 10, 0.1) == pytest.approx(0.8)
    assert dp.warmup_lr(99, 0.8, 10, 0.1) == pytest.approx(0.8)


def test_average_gradients_runs_only_under_a_process_group():
    with pytest.raises((RuntimeError, ValueError)):
        model = model_fn()
        model(torch.zeros(1, 1, 8, 8, dtype=torch.float64)).sum().backward()
        dp.average_gradients(model)


class WithAnUnusedLayer(torch.nn.Module):
    """Lesson 4's CNN and a layer the loss never uses."""

    def __init__(self):
        super().__init__()
        self.cnn, self.unused = model_fn(), torch.nn.Linear(3, 3, dtype=torch.float64)

    def forward(self, x):
        return self.cnn(x)


def both_ways_with_an_unused_layer(x, y, group=None):
    return [train(WithAnUnusedLayer, x, y, LOCAL_BATCH, LR, find_unused=True,
                  group=group)["params"] for train in (dp.train_from_scratch, dp.train_ddp)]


def test_an_unused_layer_trains_as_one_process_with_find_unused(digits):
    x, y = digits
    results = launch(both_ways_with_an_unused_layer, 2, args=(x, y))
    model = WithAnUnusedLayer()
    dp.train_one_process(model, x, y, dp.sampler_global_batches(len(y), 2, LOCAL_BATCH), LR)
    for by_hand, ddp in results:  # the unused layer keeps its weights, as on one process
        torch.testing.assert_close(by_hand, dp.parameters_vector(model), atol=1e-6, rtol=0)
        torch.testing.assert_close(ddp, dp.parameters_vector(model), atol=1e-6, rtol=0)


def test_an_epoch_that_makes_no_step_is_refused_naming_the_sizes():
    with pytest.raises(ValueError, match="world_size must be a whole number of at least 1"):
        dp.sampler_global_batches(10, 0, 2)
    with pytest.raises(ValueError, match="local_batch must be a whole number of at least 1"):
        dp.sampler_global_batches(10, 2, 0)
    with pytest.raises(ValueError, match="10 rows over 2 ranks give each 5: not one step"):
        dp.sampler_global_batches(10, 2, 6)
    assert len(dp.sampler_global_batches(10, 2, 5)) == 1
    with pytest.raises(ValueError, match="base_batch must be a whole number"):
        dp.linear_scaling_lr(0.1, 0, 64)
    with pytest.raises(ValueError, match="warmup_steps must be a whole number of at least 0"):
        dp.warmup_lr(0, 0.8, -1, 0.1)
    assert dp.warmup_lr(3, 0.8, 0, 0.1) == 0.8  # no warm-up: the target at once
    with pytest.raises(ValueError, match="step must be a whole number of at least 0"):
        dp.warmup_lr(-1, 0.8, 10, 0.1)
    with pytest.raises(ValueError, match="samples must be a whole number of at least 1"):
        dp.lesson_setup(samples=-5)
    with pytest.raises(ValueError, match="epochs must be a whole number of at least 0"):
        dp.one_process(*dp.lesson_setup(samples=32), 2, 8, 0.1, -1)


def refusals(x, y, group=None):
    said = []
    for kwargs in (dict(accumulate=0), dict(accumulate=-1), dict(accumulate=10),
                   dict(local_batch=100), dict(local_batch=0)):
        settings = dict(local_batch=LOCAL_BATCH) | kwargs
        for train in (dp.train_ddp, dp.train_from_scratch):
            if train is dp.train_from_scratch and "accumulate" in kwargs:
                continue
            try:
                train(model_fn, x, y, lr=LR, group=group, **settings)
                said.append(None)
            except ValueError as e:
                said.append(str(e))
    return said


def test_training_that_would_take_no_step_is_refused_on_every_rank(digits):
    x, y = digits[0][:64], digits[1][:64]  # 32 rows a rank: two local batches of 16
    for said in launch(refusals, 2, args=(x, y)):
        assert None not in said, said
        assert "accumulate must be a whole number of at least 1, got 0" in said[0]
        assert "got -1" in said[1]
        assert "64 rows over 2 ranks give each 32: not one step of 10 x local_batch 16" in said[2]
        assert all("not one step of 1 x local_batch 100" in s for s in said[3:5])
        assert all("local_batch must be a whole number of at least 1, got 0" in s
                   for s in said[5:])
