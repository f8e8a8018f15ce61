"""Four bits and one bit a number (course_lib.low_bits): packing, per-group scales, and the
sign, QSGD and INT4 compressors on 2 gloo ranks against the same arithmetic in one process."""

import math

import numpy as np
import pytest
import torch

from course_lib import launch
from course_lib import low_bits as L


def test_two_int4_codes_a_byte_and_back_for_every_code_and_an_odd_length():
    codes = torch.arange(-8, 8).repeat(3)[:-1]  # 47 codes
    packed = L.pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.numel() == 24
    assert torch.equal(L.unpack_int4(packed, 47).long(), codes)
    assert L.pack_int4(torch.zeros(0, dtype=torch.int8)).numel() == 0
    with pytest.raises(ValueError, match=r"4-bit codes lie in \[-8, 7\], got -9 to 7"):
        L.pack_int4(torch.tensor([-9, 7]))
    with pytest.raises(ValueError, match="24 bytes hold at most 48 codes, asked for 49"):
        L.unpack_int4(packed, 49)


def test_eight_signs_a_byte_and_zero_counts_as_plus():
    x = torch.tensor([0.0, -1.0, 2.0, -0.0, -3.0, 4.0, 5.0, -6.0, 7.0, -8.0, 9.0])
    packed = L.pack_signs(x)
    assert packed.numel() == 2  # ceil(11 / 8)
    assert L.unpack_signs(packed, 11).tolist() == [1, -1, 1, 1, -1, 1, 1, -1, 1, -1, 1]
    with pytest.raises(ValueError, match="2 bytes hold at most 16 signs, asked for 17"):
        L.unpack_signs(packed, 17)


def test_nearest_codes_are_within_half_a_step_and_smaller_groups_err_less():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g) * torch.logspace(-3, 0, 1000)  # sizes vary along it
    for bits, group in ((4, None), (4, 64), (2, 16), (8, 100)):
        codes, scales = L.quantize_groups(x, bits, group)
        assert codes.abs().max() <= L.levels(bits)
        step = scales.repeat_interleave(group or 1000)[:1000]
        assert ((L.dequantize_groups(codes, scales, group) - x).abs() <= step / 2 + 1e-7).all()
    errors = L.group_error(x, 4, [None, 256, 16])
    assert errors[None] > 1.25 * errors[256] > 1.25 * errors[16] > 0  # 0.17, 0.13, 0.08


def test_stochastic_codes_are_unbiased():
    x = torch.linspace(-1, 1, 50)
    draws = torch.stack([L.dequantize_groups(*L.quantize_groups(
        x, 4, 10, stochastic=True, generator=torch.Generator().manual_seed(s)), 10)
        for s in range(2000)])
    step = 1 / 7  # the largest |x| of each group of ten is at most 1: its step at most 1/7
    assert (draws.mean(dim=0) - x).abs().max() < 4 * step / 2 / math.sqrt(2000)
    assert not torch.equal(draws[0], draws[1])


def test_edge_inputs_work_or_are_refused_by_name():
    codes, scales = L.quantize_groups(torch.zeros(5), 4, 2)  # zeros: scale 1, codes 0
    assert codes.tolist() == [0] * 5 and scales.tolist() == [1.0] * 3
    codes, scales = L.quantize_groups(torch.zeros(0), 4)
    assert codes.numel() == scales.numel() == 0
    assert L.dequantize_groups(codes, scales).numel() == 0
    for bits in (1, 9, 4.0, True):
        with pytest.raises(ValueError, match="bits must be a whole number from 2 to 8"):
            L.levels(bits)
    for group in (0, -3, 2.5):
        with pytest.raises(ValueError, match="group must be a positive whole number"):
            L.quantize_groups(torch.ones(4), 4, group)
    for s in (0, 8):
        with pytest.raises(ValueError, match="levels s must be a whole number from 1 to 7"):
            L.QSGDCompressor(s)
    with pytest.raises(ValueError, match="bucket must be a positive whole number, got 0"):
        L.QSGDCompressor(3, bucket=0)
    with pytest.raises(ValueError, match="group must be a positive whole number"):
        L.Int4Compressor(0)


def _grads(rank):
    g = torch.Generator().manual_seed(10 + rank)
    return [torch.randn(3, 5, generator=g, dtype=torch.float64),
            torch.randn(7, generator=g, dtype=torch.float64)]


def _compress(make):
    import torch.distributed as dist

    compressor = make()
    mean, n_bytes, sent = compressor.all_reduce(_grads(dist.get_rank()))
    return [m.clone() for m in mean], n_bytes, [s.clone() for s in sent]


def _scales(grads):
    """Each tensor's mean |g|, sent as float32, repeated over its numbers."""
    return torch.cat([g.abs().mean().float().double().repeat(g.numel()) for g in grads])


def _one_process_sign(majority, ranks=2):
    flats = [torch.cat([t.reshape(-1) for t in _grads(r)]) for r in range(ranks)]
    scales = [_scales(_grads(r)) for r in range(ranks)]
    signs = [torch.where(f >= 0, 1.0, -1.0).double() for f in flats]
    if majority:
        return sum(scales) / ranks * torch.sign(sum(signs)), scales, signs
    return sum(s * z for s, z in zip(scales, signs, strict=True)) / ranks, scales, signs


@pytest.mark.parametrize("majority", [False, True], ids=["scaled signs", "majority vote"])
def test_sign_compressors_deliver_the_one_process_mean_in_one_bit_a_number(majority):
    results = launch(_compress, 2, args=(lambda: L.SignCompressor(majority),))
    expected, scales, signs = _one_process_sign(majority)
    for rank, (mean, n_bytes, sent) in enumerate(results):
        torch.testing.assert_close(torch.cat([m.reshape(-1) for m in mean]), expected)
        assert n_bytes == math.ceil(22 / 8) + 4 * 2 and mean[0].dtype == torch.float64
        torch.testing.assert_close(torch.cat([s.reshape(-1) for s in sent]),
                                   scales[rank] * signs[rank])


def test_qsgd_decodes_the_same_mean_as_one_process_and_is_unbiased_within_its_bound():
    results = launch(_compress, 2, args=(lambda: L.QSGDCompressor(s=3, seed=5),))
    compressor = L.QSGDCompressor(s=3)
    decoded = []
    for r in range(2):  # each rank's rounding: seed 5, first call, its rank
        flat = torch.cat([t.reshape(-1) for t in _grads(r)])
        codes, norm = compressor.encode(flat, torch.Generator().manual_seed(5 * 1_000_003 + r))
        assert codes.abs().max() <= 3 and norm.numel() == 1
        decoded.append(compressor.decode(codes, norm.float()))  # the norm travels as float32
    for rank, (mean, n_bytes, sent) in enumerate(results):
        torch.testing.assert_close(torch.cat([m.reshape(-1) for m in mean]),
                                   (decoded[0] + decoded[1]) / 2)
        torch.testing.assert_close(torch.cat([s.reshape(-1) for s in sent]), decoded[rank])
        assert n_bytes == 11 + 4  # 22 four-bit codes and the norm
    g = torch.cat([t.reshape(-1) for t in _grads(0)])
    draws = torch.stack([compressor.decode(*compressor.encode(g, torch.Generator().manual_seed(s)))
                         for s in range(4000)])
    spread = draws.std(dim=0) / math.sqrt(4000)
    assert ((draws.mean(dim=0) - g).abs() < 5 * spread + 1e-12).all()  # unbiased
    variance = ((draws - g) ** 2).sum(dim=1).mean() / g.norm() ** 2
    assert variance <= L.qsgd_variance_bound(22, 3)
    assert L.qsgd_variance_bound(22, 3) == min(22 / 9, math.sqrt(22) / 3)
    for d, s in ((22, 0), (-1, 3), (22, 1.5)):
        with pytest.raises(ValueError, match="must be a whole number of at least 1"):
            L.qsgd_variance_bound(d, s)
    # buckets of 4: a norm each, six of them sent; the bound is a bucket's, and far lower
    bucketed = L.QSGDCompressor(s=3, bucket=4)
    codes, norms = bucketed.encode(g, torch.Generator().manual_seed(0))
    assert norms.numel() == 6 and torch.allclose(norms[0], g[:4].norm())
    draws = torch.stack([bucketed.decode(*bucketed.encode(g, torch.Generator().manual_seed(s)))
                         for s in range(4000)])
    assert ((draws - g) ** 2).sum(dim=1).mean() / g.norm() ** 2 <= L.qsgd_variance_bound(4, 3)
    assert L.qsgd_variance_bound(4, 3) < 0.5 * L.qsgd_variance_bound(22, 3)


def test_int4_with_group_scales_sums_after_unpacking_as_one_process_does():
    results = launch(_compress, 2, args=(lambda: L.Int4Compressor(group=4),))
    deq = []
    for r in range(2):
        flat = torch.cat([t.reshape(-1) for t in _grads(r)])
        codes, scales = L.quantize_groups(flat, 4, 4)
        deq.append(L.dequantize_groups(codes, scales, 4).double())
    for rank, (mean, n_bytes, sent) in enumerate(results):
        torch.testing.assert_close(torch.cat([m.reshape(-1) for m in mean]),
                                   (deq[0] + deq[1]) / 2)
        torch.testing.assert_close(torch.cat([s.reshape(-1) for s in sent]), deq[rank])
        assert n_bytes == 11 + 4 * 6  # 22 codes, two a byte; 6 groups' float32 scales
    # the codes' sum needs more than 4 bits: two ranks' largest codes reach 14
    both = [L.quantize_groups(torch.ones(8), 4, 4)[0] for _ in range(2)]
    assert (both[0].int() + both[1].int()).max() == 14 > 7


def _train_each(model_fn, split, steps):
    from course_lib import compression

    out = {}
    for make in (lambda: L.SignCompressor(), lambda: L.SignCompressor(majority=True),
                 lambda: L.QSGDCompressor(7, bucket=16), lambda: L.Int4Compressor(32)):
        compressor = make()
        out[compressor.name] = compression.train(
            model_fn, split.x_train, split.y_train, split.x_test, split.y_test, compressor,
            True, 32, steps, 0.1)
    return out


def test_each_compressor_trains_a_model_with_error_feedback_in_far_fewer_bytes():
    import functools

    from course_lib.data import load_digits
    from course_lib.models import digits_mlp

    split = load_digits()
    model_fn = functools.partial(digits_mlp, width=8, depth=1)
    dense = sum(p.numel() for p in model_fn().parameters()) * 4  # float32 bytes a step
    runs = launch(_train_each, 2, args=(model_fn, split, 40))[0]
    assert list(runs) == ["sign x mean |g|", "signSGD, majority vote",
                          "QSGD s = 7, buckets of 16", "INT4, groups of 32"]
    for name, r in runs.items():
        first, last = sum(r["losses"][:5]) / 5, sum(r["losses"][-5:]) / 5
        assert last < 0.8 * first, name  # it learns
        limit = dense / 25 if name.startswith("sign") else dense / 5  # scales cost too
        assert r["bytes"] < limit, (name, r["bytes"], dense)


def _vote_and_feedback():
    import torch.distributed as dist

    from course_lib.compression import ErrorFeedback, compressed_mean

    grads = _grads(dist.get_rank())
    feedback = ErrorFeedback()
    mean, _ = compressed_mean(L.SignCompressor(majority=True), feedback, grads)
    return [m.clone() for m in mean], [r.clone() for r in feedback.residual]


def test_majority_vote_on_three_ranks_is_the_sign_of_the_summed_signs_and_feedback_keeps_the_rest():
    results = launch(_vote_and_feedback, 3)
    expected, scales, signs = _one_process_sign(True, ranks=3)
    flats = [torch.cat([t.reshape(-1) for t in _grads(r)]) for r in range(3)]
    assert (torch.sign(sum(signs)) != 0).all()  # three voters: never a tie
    for rank, (mean, residual) in enumerate(results):
        torch.testing.assert_close(torch.cat([m.reshape(-1) for m in mean]), expected)
        # error feedback keeps exactly what this rank's message did not carry
        sent = scales[rank] * signs[rank]
        torch.testing.assert_close(torch.cat([r.reshape(-1) for r in residual]),
                                   flats[rank] - sent)


def _edge_compress(make):
    import torch.distributed as dist

    rank = dist.get_rank()
    out = {}
    # an unused parameter's zeros, and a float16 gradient beside a float32 one
    mean, _, _ = make().all_reduce([torch.randn(6, generator=torch.Generator().manual_seed(rank)),
                                    torch.zeros(4), torch.full((3,), 300.0).half()])
    out["zeros"], out["dtypes"] = mean[1].tolist(), [m.dtype for m in mean]
    out["finite"] = bool(torch.isfinite(mean[2].float()).all())
    try:
        make().all_reduce([torch.randn(5 + rank)])
        out["sizes"] = ""
    except ValueError as why:
        out["sizes"] = str(why)
    try:  # rank 1 diverged: both ranks refuse, neither waits for the other
        make().all_reduce([torch.tensor([1.0, float("inf") if rank else 2.0])])
        out["diverged"] = ""
    except ValueError as why:
        out["diverged"] = str(why)
    return out


@pytest.mark.parametrize("make", [lambda: L.SignCompressor(), lambda: L.SignCompressor(True),
                                  lambda: L.QSGDCompressor(7, bucket=4),
                                  lambda: L.Int4Compressor(4)],
                         ids=["signs", "majority vote", "QSGD", "INT4"])
def test_zero_gradients_stay_zero_dtypes_stay_and_ranks_of_other_sizes_are_refused(make):
    for r in launch(_edge_compress, 2, args=(make,)):
        assert r["zeros"] == [0.0] * 4  # an unused parameter does not move
        assert r["dtypes"] == [torch.float32, torch.float32, torch.float16] and r["finite"]
        assert r["sizes"] == "the ranks' gradients hold different numbers of values: [5, 6]"
        assert r["diverged"].startswith("the gradients of rank(s) [1] hold NaN or inf")


def test_bad_codes_scales_and_values_are_refused_by_name():
    with pytest.raises(ValueError, match="4-bit codes are integers: round them first"):
        L.pack_int4(torch.tensor([3.7, -2.9]))
    with pytest.raises(ValueError, match=r"lie in \[-8, 7\], got -65536 to 65539"):
        L.pack_int4(torch.tensor([65539, -65536, 7]))
    with pytest.raises(ValueError, match="cannot quantise NaN or inf"):
        L.quantize_groups(torch.tensor([0.5, float("nan"), 1.0]), 4, 3)
    codes, scales = L.quantize_groups(torch.randn(12), 4, 3)
    for wrong in (6, None):
        with pytest.raises(ValueError, match="12 codes in groups of .* have .* scales, got 4"):
            L.dequantize_groups(codes, scales, wrong)
    with pytest.raises(ValueError, match="group must be a positive whole number"):
        L.dequantize_groups(codes, scales, 2.5)
    with pytest.raises(ValueError, match="hold at most"):
        L.unpack_int4(L.pack_int4(codes), 2.5)


def test_counts_and_sizes_from_numpy_work_as_python_ints():
    codes = torch.tensor([1, -2, 3], dtype=torch.int8)
    assert torch.equal(L.unpack_int4(L.pack_int4(codes), np.int64(3)), codes)
    signs = torch.randn(5)
    assert torch.equal(L.unpack_signs(L.pack_signs(signs), np.int64(5)),
                       L.unpack_signs(L.pack_signs(signs), 5))
    assert L.levels(np.int64(4)) == L.levels(4)
    assert L.QSGDCompressor(np.int64(4), bucket=np.int64(8)).name == L.QSGDCompressor(4, 8).name
