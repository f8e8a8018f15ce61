"""Low-precision communication and fp8 products (course_lib.quantization)."""

import math

import numpy as np
import pytest
import torch

from course_lib import launch
from course_lib import quantization as qz
from course_lib.cost_models import quantized_sum_error_bound as error_bound


def _tensors(p=2, n=10_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) * (r + 1) for r in range(p)]


def test_stochastic_rounding_is_unbiased_and_off_by_less_than_one():
    x = torch.full((200_000,), 2.3, dtype=torch.float64)
    r = qz.stochastic_round(x, torch.Generator().manual_seed(0))
    assert set(r.unique().tolist()) == {2.0, 3.0}
    assert r.mean().item() == pytest.approx(2.3, abs=0.005)  # 0.3 of them round up
    y = torch.linspace(-5, 5, 1001, dtype=torch.float64)
    assert (qz.stochastic_round(y) - y).abs().max() < 1


def test_quantize_uses_the_symmetric_int8_range():
    q = qz.quantize(torch.tensor([-1.0, 0.0, 0.5, 1.0, 3.0]), 1 / 127, stochastic=False)
    assert q.dtype == torch.int8
    assert q.tolist() == [-127, 0, 64, 127, 127]  # 3.0 is out of range: clamped


@pytest.mark.parametrize("stochastic", [True, False])
def test_quantized_all_reduce_on_two_ranks_equals_the_single_process_simulation(stochastic):
    tensors = _tensors()

    def run(tensors, stochastic):
        from torch import distributed as dist
        return qz.quantized_all_reduce(tensors[dist.get_rank()], stochastic=stochastic, seed=3)

    results = launch(run, 2, args=(tensors, stochastic))
    want = qz.simulate_quantized_sum(tensors, stochastic=stochastic, seed=3)
    for out in results:
        torch.testing.assert_close(out["sum"], want)
    exact = tensors[0] + tensors[1]
    error = (results[0]["sum"] - exact).abs().max().item()
    assert error <= results[0]["bound"]  # the stated bound holds for every entry
    assert results[0]["bound"] == pytest.approx(error_bound(2, results[0]["scale"], stochastic))
    assert results[0]["bytes_sent"] == 10_000  # one byte per number, to one other rank


def test_the_error_bound_holds_and_stochastic_rounding_averages_out():
    tensors = _tensors(p=4, n=2000)
    exact = torch.stack(tensors).sum(dim=0)
    scale = max(t.abs().max().item() for t in tensors) / 127
    sums = torch.stack([qz.simulate_quantized_sum(tensors, seed=s) for s in range(200)])
    assert (sums - exact).abs().max() <= error_bound(4, scale)
    nearest = qz.simulate_quantized_sum(tensors, stochastic=False)
    assert (nearest - exact).abs().max() <= error_bound(4, scale, stochastic=False)
    # unbiased: the mean of 200 stochastic sums is much closer than any single one
    assert (sums.mean(dim=0) - exact).abs().mean() < 0.2 * (sums[0] - exact).abs().mean()


def test_compressed_all_reduce_halves_bytes_in_16_bits_and_quarters_them_in_int8():
    tensors = _tensors(n=4096)

    def run(tensors):
        from torch import distributed as dist
        mine = tensors[dist.get_rank()]
        before = mine.clone()
        out = {m: qz.compressed_all_reduce(mine, m) for m in qz.METHODS}
        return out | {"input unchanged": torch.equal(mine, before)}

    out = launch(run, 2, args=(tensors,))[0]
    assert out["input unchanged"]
    exact = tensors[0] + tensors[1]
    sent = {m: out[m]["bytes_sent"] for m in qz.METHODS}
    assert sent["fp32"] == 4096 * 4 and sent["fp16"] == sent["bf16"] == 4096 * 2
    assert sent["int8 stochastic"] == sent["int8 nearest"] == 4096
    torch.testing.assert_close(out["fp32"]["sum"], exact)
    errors = {m: qz.relative_error(out[m]["sum"], exact) for m in qz.METHODS}
    assert errors["fp16"] < errors["bf16"] < errors["int8 nearest"] < 0.02


def test_all_zero_tensors_reduce_to_zero():
    def run():
        return qz.quantized_all_reduce(torch.zeros(5))

    for r in launch(run, 2):
        torch.testing.assert_close(r["sum"], torch.zeros(5), rtol=0, atol=1e-12)


def test_scaled_fp8_keeps_small_matrices_that_unscaled_fp8_flushes():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=g) * 1e-3, torch.randn(64, 64, generator=g) * 1e-3
    exact = a @ b
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        scaled = qz.relative_error(qz.fp8_matmul(a, b, dtype), exact)
        assert scaled < 0.1
    # e4m3's smallest subnormal is 2^-9 ~ 0.002: most entries of size 1e-3 become 0 unscaled
    assert qz.relative_error(qz.fp8_matmul(a, b, torch.float8_e4m3fn, scaled=False), exact) > 0.5
    e4m3 = qz.relative_error(qz.fp8_matmul(a, b, torch.float8_e4m3fn), exact)
    e5m2 = qz.relative_error(qz.fp8_matmul(a, b, torch.float8_e5m2), exact)
    assert e4m3 < e5m2  # one more mantissa bit
    assert math.isinf(qz.relative_error(torch.tensor([float("inf")]), torch.tensor([1.0])))
    assert qz.relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert math.isinf(qz.relative_error(torch.ones(2), torch.zeros(2)))
    with pytest.raises(ValueError, match="differ in shape"):
        qz.relative_error(torch.ones(3, 1), torch.ones(3))
    with pytest.raises(ValueError, match="needs a finite max"):
        qz.fp8_matmul(torch.tensor([[1.0, float("inf")], [1.0, 0.0]]), torch.eye(2),
                      torch.float8_e4m3fn)


def test_int8_codes_refuse_what_they_cannot_represent():
    for scale in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale must be a positive, finite number"):
            qz.quantize(torch.ones(2), scale)
    with pytest.raises(ValueError, match="inf or NaN entries"):
        qz.simulate_quantized_sum([torch.tensor([1.0, float("inf")]), torch.ones(2)])
    for tensors in ([], [torch.ones(2), torch.ones(3)]):
        with pytest.raises(ValueError, match="one tensor per rank, all of one shape"):
            qz.simulate_quantized_sum(tensors)
    torch.testing.assert_close(qz.simulate_quantized_sum([torch.zeros(3)] * 2), torch.zeros(3))


def _nan_on_rank_1(group=None):
    import torch.distributed as dist

    x = torch.ones(4)
    if dist.get_rank(group) == 1:
        x[2] = float("nan")
    return qz.quantized_all_reduce(x, group=group)


def test_a_nan_on_one_rank_is_refused_on_every_rank_not_left_waiting():
    from course_lib import WorkerError

    # each rank must learn of it: a rank that raised alone would leave the other in all_gather
    with pytest.raises(WorkerError, match="a rank's x has inf or NaN entries") as raised:
        launch(_nan_on_rank_1, 2, timeout=120)
    assert "rank 0" in str(raised.value) or "rank 1" in str(raised.value)


def test_an_all_zero_matrix_goes_through_fp8_as_zeros():
    a, b = torch.zeros(3, 4), torch.randn(4, 2, generator=torch.Generator().manual_seed(0))
    codes, scale = qz.to_fp8(a, torch.float8_e4m3fn)
    assert scale == 1.0 and codes.float().abs().max() == 0  # no division by a zero maximum
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        assert torch.equal(qz.fp8_matmul(a, b, dtype), torch.zeros(3, 2))
    assert qz.to_fp8(torch.zeros(0), torch.float8_e5m2)[1] == 1.0


def test_a_scale_from_a_tensor_or_numpy_is_a_number_but_a_bool_is_not():
    x = torch.randn(50, dtype=torch.float64)
    scale = x.abs().max() / 127  # a one-number tensor, as a student computes it
    torch.testing.assert_close(qz.quantize(x, scale, stochastic=False),
                               qz.quantize(x, scale.item(), stochastic=False))
    torch.testing.assert_close(qz.quantize(x, np.float32(0.05), stochastic=False),
                               qz.quantize(x, float(np.float32(0.05)), stochastic=False))
    with pytest.raises(ValueError, match="scale must be a positive, finite number, got True"):
        qz.quantize(x, True)
