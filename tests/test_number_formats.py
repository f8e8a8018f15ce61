"""Number formats computed from torch.finfo / iinfo and bit patterns (course_lib.number_formats)."""

import math

import numpy as np
import pytest
import torch

from course_lib import number_formats as nf


def test_the_table_matches_the_reference_numbers():
    rows = {row["name"]: row for row in nf.format_table()}
    assert rows["fp16"]["max"] == 65504
    assert rows["fp16"]["smallest_normal"] == pytest.approx(2.0 ** -14)
    assert rows["fp16"]["smallest_subnormal"] == pytest.approx(2.0 ** -24)
    assert rows["fp16"]["eps"] == pytest.approx(2.0 ** -10)
    assert rows["bf16"]["eps"] == 2.0 ** -7 and rows["bf16"]["max"] == pytest.approx(3.39e38,
                                                                                     rel=1e-3)
    assert rows["fp8 e4m3"]["max"] == 448 and rows["fp8 e5m2"]["max"] == 57344
    assert rows["fp8 e4m3"]["smallest_subnormal"] == pytest.approx(2.0 ** -9)
    assert rows["int8"]["max"] == 127 and rows["int8"]["bits"] == 8
    assert rows["fp32"]["smallest_subnormal"] == pytest.approx(2.0 ** -149, rel=1e-6)


@pytest.mark.parametrize("dtype, count", [(torch.float8_e4m3fn, 126), (torch.float8_e5m2, 123),
                                          (torch.float16, 31743)])
def test_positive_values_enumerates_every_finite_positive_value(dtype, count):
    values = nf.positive_values(dtype)
    assert len(values) == count  # e4m3fn: 127 patterns minus NaN; e5m2: 124 minus inf
    assert values[0] == nf.smallest_subnormal(dtype)
    assert values[-1] == torch.finfo(dtype).max
    assert torch.all(values[1:] > values[:-1])
    with pytest.raises(ValueError, match="too many"):
        nf.positive_values(torch.float32)


def test_fraction_flushed_counts_zeros_subnormals_and_overflow():
    values = torch.tensor([1e-9, 1e-6, 1.0, 1e5], dtype=torch.float64)  # fp16: 0, sub, ok, inf
    quarter = dict(zero=0.25, subnormal=0.25, overflow=0.25)
    assert nf.fraction_flushed(values, torch.float16) == pytest.approx(quarter)
    scaled = nf.fraction_flushed(values, torch.float16, scale=2.0 ** 10)
    assert scaled["zero"] == pytest.approx(0.0) and scaled["overflow"] == pytest.approx(0.25)
    assert nf.fraction_flushed(values, torch.bfloat16)["zero"] == pytest.approx(0.0)
    # past fp16's largest, 65504, by less than half a step (16) rounds down to it: not inf
    edge = torch.tensor([65510.0, 65519.0, 65520.0, 7e4], dtype=torch.float64)
    assert nf.fraction_flushed(edge, torch.float16)["overflow"] == 0.5  # it said 1.0
    e5m2 = torch.tensor([6e4, 61439.0, 61440.0, 7e4], dtype=torch.float64)  # 57344 + 4096
    assert nf.fraction_flushed(e5m2, torch.float8_e5m2)["overflow"] == 0.5
    # e4m3 has no inf: what lies past 448 saturates there, and counts as overflow
    assert nf.fraction_flushed(torch.tensor([400.0, 449.0, 1e4]), torch.float8_e4m3fn)[
        "overflow"] == pytest.approx(2 / 3)
    # zeros are ignored; with nothing else there is nothing to count (it used to give NaNs)
    assert nf.fraction_flushed(torch.tensor([0.0, 1e-9]), torch.float16)["zero"] == 1.0
    with pytest.raises(ValueError, match="holds no non-zero number"):
        nf.fraction_flushed(torch.zeros(3), torch.float16)
    for scale in (torch.tensor(256.0), np.float32(256.0), 256):  # any one number will do
        assert nf.fraction_flushed(values, torch.float16, scale) == \
            nf.fraction_flushed(values, torch.float16, 256.0)
    # NaN used to report no loss
    for scale in (float("nan"), 0, -2.0, float("inf"), True, "2", torch.ones(2)):
        with pytest.raises(ValueError, match="scale must be a positive, finite number"):
            nf.fraction_flushed(values, torch.float16, scale)


def test_an_update_is_lost_in_fp16_from_a_ratio_of_2048():
    assert nf.update_is_lost(1.0, 1 / 4096, torch.float16)
    assert not nf.update_is_lost(1.0, 1 / 1024, torch.float16)
    assert not nf.update_is_lost(1.0, 1 / 4096, torch.float32)
    assert nf.update_is_lost(1.0, 2.0 ** -9, torch.bfloat16)
    assert math.isclose(2 / torch.finfo(torch.float16).eps, 2048)


def test_float64_and_fp8_formats_are_read_and_counted_too():
    assert nf.smallest_subnormal(torch.float64) == 2.0 ** -1074
    assert nf.format_table({"fp64": torch.float64})[0]["eps"] == 2.0 ** -52
    values = torch.tensor([1e-12, 1.0, 500.0, 1e5], dtype=torch.float64)
    e4m3 = nf.fraction_flushed(values, torch.float8_e4m3fn)  # it saturates at 448, has no inf
    assert e4m3 == pytest.approx(dict(zero=0.25, subnormal=0.0, overflow=0.5))
    assert nf.fraction_flushed(values, torch.float8_e5m2)["overflow"] == pytest.approx(0.25)


def test_fraction_flushed_refuses_nan_which_has_no_fate():
    with pytest.raises(ValueError, match="values holds NaN"):
        nf.fraction_flushed(torch.tensor([1.0, float("nan")]), torch.float16)
    assert nf.fraction_flushed(torch.tensor([1.0, float("inf")]), torch.float16)["overflow"] == 0.5
