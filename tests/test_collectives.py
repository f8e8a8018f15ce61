"""All-reduce four ways (course_lib.collectives) against dist.all_reduce, with 2 and 3 ranks."""

import contextlib

import pytest
import torch
import torch.distributed as dist

from course_lib import collectives as C
from course_lib import launch
from course_lib.cost_models import all_reduce_bytes
from course_lib.runtime.devices import usable_cores

LENGTHS = [1, 2, 5, 7, 12, 1001]  # not all multiples of the world size, some shorter than it


def oversubscribed(world_size):
    """Three ranks on a two-core machine warn; that is expected here."""
    if world_size > usable_cores():
        return pytest.warns(RuntimeWarning, match="oversubscribed")
    return contextlib.nullcontext()


def rank_input(rank, numel, dtype):
    g = torch.Generator().manual_seed(1000 * rank + numel)
    return torch.randn(numel, generator=g, dtype=dtype)


def every_variant():
    """On every rank: each all-reduce (and the library's) of this rank's input vectors."""
    out = {}
    for dtype in (torch.float32, torch.float64):
        for numel in LENGTHS:
            x = rank_input(dist.get_rank(), numel, dtype)
            for name, fn in {**C.ALL_REDUCES, "torch": C.torch_all_reduce}.items():
                out[name, dtype, numel] = fn(x)
    # a transposed gradient, not contiguous: dist.all_reduce takes it, and so does each of ours
    x = rank_input(dist.get_rank(), 12, torch.float64).reshape(3, 4).T
    expected = x.clone()
    dist.all_reduce(expected)
    out["transposed"] = expected, {name: fn(x)[0] for name, fn in C.ALL_REDUCES.items()}
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_all_reduce_equals_dist_all_reduce_for_any_length_and_dtype(world_size):
    with oversubscribed(world_size):
        results = launch(every_variant, world_size)
    for dtype in (torch.float32, torch.float64):
        for numel in LENGTHS:
            expected = sum(rank_input(r, numel, dtype) for r in range(world_size))
            for rank, res in enumerate(results):
                library = res["torch", dtype, numel][0]
                torch.testing.assert_close(library, expected)
                for name in C.ALL_REDUCES:
                    got = res[name, dtype, numel][0]
                    assert got.dtype == dtype and got.shape == (numel,)
                    torch.testing.assert_close(got, library, msg=f"{name}, rank {rank}, n={numel}")
    for expected, got in (res["transposed"] for res in results):
        for name, t in got.items():
            assert t.shape == (4, 3), name
            torch.testing.assert_close(t, expected, msg=name)


@pytest.mark.parametrize("world_size", [2, 3])
def test_bytes_sent_by_the_busiest_rank_match_the_formulas(world_size):
    with oversubscribed(world_size):
        results = launch(every_variant, world_size)
    numel = 12  # a multiple of 2 and 3: the ring's chunks are equal
    n_bytes = numel * 4
    for name in C.ALL_REDUCES:
        busiest = max(res[name, torch.float32, numel][1] for res in results)
        assert busiest == all_reduce_bytes(name, n_bytes, world_size), name


def trace_ring():
    trace = []
    x = torch.full((8,), float(dist.get_rank() + 1))
    C.ring_all_reduce(x, trace=trace)
    return [(phase, step, [c.tolist() for c in chunks]) for phase, step, chunks in trace]


def test_efficient_ring_trace_on_four_ranks_matches_the_lectures_pictures():
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        traces = launch(trace_ring, 4)
    p, total = 4, 1 + 2 + 3 + 4
    for rank, trace in enumerate(traces):
        phases = [("start", 0)] + [("reduce-scatter", s) for s in (1, 2, 3)]
        assert [t[:2] for t in trace] == phases + [("all-gather", s) for s in (1, 2, 3)]
        after_reduce_scatter = trace[3][2]
        # rank r now owns the full sum of chunk (r + 1) mod p
        assert after_reduce_scatter[(rank + 1) % p] == pytest.approx([total] * 2)
        assert all(chunk == pytest.approx([total] * 2) for chunk in trace[-1][2])
        assert len(trace[-1][2]) == p


def test_an_empty_vector_is_refused_before_any_message():
    for numel in (0, -3, 2.0):
        with pytest.raises(ValueError, match="numel must be a whole number of at least 1"):
            C.four_ways(numel=numel)


def test_ring_chunks_cover_the_vector_in_near_equal_parts():
    chunks = C.ring_chunks(torch.arange(10.0), 4)
    assert [len(c) for c in chunks] == [3, 3, 2, 2]
    assert [len(c) for c in C.ring_chunks(torch.arange(2.0), 3)] == [1, 1, 0]


def time_two_sizes():
    return C.time_all_reduce(C.ring_all_reduce, [4, 4096], repeats=2, warmup=1)


def test_time_all_reduce_returns_repeats_per_size():
    times = launch(time_two_sizes, 2)
    assert set(times[0]) == {4, 4096} and all(len(v) == 2 for v in times[0].values())
    for kwargs, named in ((dict(repeats=0), "repeats"), (dict(warmup=-1), "warmup"),
                          (dict(numels=[4.0]), "each length in numels")):
        with pytest.raises(ValueError, match=named):  # refused before any message
            C.time_all_reduce(C.ring_all_reduce, **{"numels": [4], **kwargs})


def _all_to_all_and_back(x, group=None):
    import torch.distributed as dist

    from course_lib.collectives import all_to_all

    rank = dist.get_rank(group)
    mine = (x[rank] * 1.0).requires_grad_(True)  # slice s of rank r: x[r, s]
    strided = mine.t().contiguous().t()  # the same values, not laid out row by row
    assert not strided.is_contiguous()
    out = all_to_all(strided, group)
    (out * torch.arange(1.0, 1 + out.numel()).reshape(out.shape)).sum().backward()
    return out.detach(), mine.grad


@pytest.mark.filterwarnings("ignore:.*oversubscribed")  # 3 ranks on 2 cores: results only
def test_all_to_all_sends_slice_s_to_rank_s_and_its_gradient_back():
    p = 3
    x = torch.arange(p * p * 2, dtype=torch.float64).reshape(p, p, 2)
    results = launch(_all_to_all_and_back, p, args=(x,))
    weights = torch.arange(1.0, 1 + p * 2, dtype=torch.float64).reshape(p, 2)
    for r, (out, grad) in enumerate(results):
        torch.testing.assert_close(out, x[:, r])  # slice s of the result came from rank s
        # d(sum w * out)/d(mine[s]): rank s's out[r] holds mine[s], weighted by w[r]
        torch.testing.assert_close(grad, weights[r].expand(p, 2))


def test_all_to_all_refuses_a_tensor_without_one_slice_per_rank():

    with pytest.raises(Exception, match="one slice per rank on dim 0: 2 ranks"):
        launch(_all_to_all_wrong, 2)


def _all_to_all_wrong(group=None):
    from course_lib.collectives import all_to_all

    return all_to_all(torch.zeros(3, 2), group)


def _sum_in_my_row(rows):
    group = C.subgroups(torch.tensor(rows))
    x = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(x, group=group)
    try:
        C.subgroups([[r for r in range(dist.get_world_size()) if r != 0]])  # a list works too
        missing = ""
    except ValueError as why:
        missing = str(why)
    return x.item(), dist.get_world_size(group), missing


def test_subgroups_give_each_rank_its_row_and_name_a_rank_left_out():
    results = launch(_sum_in_my_row, world_size=4, args=([[0, 2], [1, 3]],))
    assert [r[:2] for r in results] == [(2.0, 2), (4.0, 2), (2.0, 2), (4.0, 2)]
    assert results[0][2] == "rank 0 is in no row of [[1, 2, 3]]"
    assert [r[2] for r in results[1:]] == ["", "", ""]


def _refusals_of_subgroups():
    said = []
    for rows in ([[0, 1], [1]], [[0, 0], [1]], [[0], [1], []], [[0], [1, 2]], [[0], [1.0]]):
        try:
            C.subgroups(rows)
        except ValueError as why:
            said.append(str(why))
    return said


def test_subgroups_refuse_a_rank_in_two_rows_an_empty_row_or_a_rank_outside_the_world():
    # a rank in two rows would leave the ranks waiting in groups that do not pair up
    said = launch(_refusals_of_subgroups, world_size=2, timeout=60)
    assert said[0] == said[1] and len(said[0]) == 5, said
    assert said[0][0] == "rank(s) [1] appear twice in [[0, 1], [1]]: every rank is in one row"
    assert said[0][1].startswith("rank(s) [0] appear twice")
    for message in said[0][2:]:
        assert "a row lists at least one rank, each a whole number from 0 to 1" in message
