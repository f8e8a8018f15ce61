"""Context parallelism (course_lib.context_parallel): blockwise attention with the online
softmax in one process, ring attention and Ulysses on gloo ranks, against one process's
attention in float64."""

import pytest
import torch
import torch.nn.functional as F

from course_lib import context_parallel as cp
from course_lib import launch
from course_lib.cost_models import context_parallel_bytes

pytestmark = pytest.mark.filterwarnings("ignore:.*oversubscribed")  # 4 ranks: results only
HEADS, TOKENS, DIM = 4, 24, 8


def qkv(tokens=TOKENS, heads=HEADS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(heads, tokens, DIM, generator=g, dtype=torch.float64) for _ in range(4)]


def attention(q, k, v, causal):
    """One process, written out: softmax(Q K^T / sqrt(d)) V, masked above the diagonal."""
    s = q @ k.transpose(-2, -1) / DIM ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(len(q[0]), len(k[0]), dtype=torch.bool).triu(1),
                          float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def reference(q, k, v, d_out, causal):
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = attention(q, k, v, causal)
    out.backward(d_out)
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 5, 8, TOKENS, 100])
def test_blockwise_attention_is_attention(block, causal):
    q, k, v, _ = qkv()
    torch.testing.assert_close(cp.blockwise_attention(q, k, v, block, causal),
                               attention(q, k, v, causal))
    torch.testing.assert_close(attention(q, k, v, causal),
                               F.scaled_dot_product_attention(q, k, v, is_causal=causal))


def test_the_online_softmax_rescales_what_it_summed_when_the_maximum_rises():
    q = torch.ones(1, 1, 1, dtype=torch.float64)
    k = torch.tensor([[[0.0], [50.0]]], dtype=torch.float64)  # the second key's score is far larger
    v = torch.tensor([[[1.0], [2.0]]], dtype=torch.float64)
    state = cp.OnlineSoftmax(q)
    state.add(q @ k[:, :1].transpose(-2, -1), v[:, :1])
    assert state.m.item() == 0.0 and state.l.item() == 1.0
    state.add(q @ k[:, 1:].transpose(-2, -1), v[:, 1:])
    out, lse = state.result()
    assert state.m.item() == 50.0
    scores = torch.tensor([0.0, 50.0], dtype=torch.float64)
    torch.testing.assert_close(lse.reshape(()), torch.logsumexp(scores, 0))
    torch.testing.assert_close(out.reshape(1), torch.softmax(scores, 0) @ v[0])


def test_blockwise_attention_refuses_an_empty_block():
    q, k, v, _ = qkv()
    with pytest.raises(ValueError, match="block must be a positive"):
        cp.blockwise_attention(q, k, v, 0)


def test_the_zigzag_split_pairs_chunk_r_with_chunk_2p_minus_1_minus_r():
    assert cp.sequence_positions(8, 2, 0, "zigzag").tolist() == [0, 1, 6, 7]
    assert cp.sequence_positions(8, 2, 1, "zigzag").tolist() == [2, 3, 4, 5]
    assert cp.sequence_positions(6, 3, 2).tolist() == [4, 5]
    x = torch.arange(2 * 12 * 3).reshape(2, 12, 3)
    for layout in cp.LAYOUTS:
        parts = [cp.split_sequence(x, 3, r, layout) for r in range(3)]
        assert torch.equal(cp.gather_sequence(parts, layout), x)


@pytest.mark.parametrize("tokens, ranks, layout, message", [
    (10, 4, "contiguous", "multiple of 4"), (6, 2, "zigzag", "multiple of 4"),
    (8, 2, "striped", "layout must be"), (8, 2, "contiguous", None)])
def test_a_split_that_does_not_divide_is_refused(tokens, ranks, layout, message):
    if message is None:
        assert len(cp.sequence_positions(tokens, ranks, 1, layout)) == tokens // ranks
        with pytest.raises(ValueError, match="rank 2 is not one of 2"):
            cp.sequence_positions(tokens, ranks, 2, layout)
        return
    with pytest.raises(ValueError, match=message):
        cp.sequence_positions(tokens, ranks, 0, layout)


@pytest.mark.parametrize("ranks, layout, causal", [
    (2, "contiguous", False), (2, "zigzag", True), (4, "contiguous", True), (4, "zigzag", False),
    (4, "zigzag", True)])
def test_ring_attention_on_ranks_is_one_process_attention_forward_and_backward(ranks, layout,
                                                                              causal):
    q, k, v, d_out = qkv()
    results = launch(cp.run_context_parallel, ranks, args=(q, k, v, d_out),
                     kwargs=dict(causal=causal, layout=layout))
    out, dq, dk, dv = reference(q, k, v, d_out, causal)
    for name, whole in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        torch.testing.assert_close(cp.gather_sequence([r[name] for r in results], layout), whole)
    for r in results:  # p - 1 blocks forward, p passes back; each block is k and v (and dk, dv)
        share = HEADS * TOKENS // ranks * DIM * 8
        assert r["counts"]["messages"] == 2 * ranks - 1
        backward = ranks * 4 * share
        assert r["counts"]["bytes"] == context_parallel_bytes(share, ranks, "ring") + backward


def test_a_causal_contiguous_split_gives_the_last_rank_p_times_the_first_ranks_work():
    q, k, v, d_out = qkv()
    work = {layout: [r["counts"]["blocks"] for r in launch(
        cp.run_context_parallel, 4, args=(q, k, v, d_out), kwargs=dict(causal=True,
                                                                          layout=layout))]
            for layout in cp.LAYOUTS}
    assert work["contiguous"] == [1, 2, 3, 4]
    assert work["zigzag"] == [4, 4, 4, 4]  # each block pair holds some unmasked pairs: none skipped


def test_zigzag_gives_every_rank_the_same_scores_to_compute_chunk_by_chunk():
    q, k, v, d_out = qkv()  # 24 tokens on 4 ranks: 6 each, zigzag chunks of 3
    scores = {layout: [r["counts"]["scores"] for r in launch(
        cp.run_context_parallel, 4, args=(q, k, v, d_out), kwargs=dict(causal=True,
                                                                          layout=layout))]
        for layout in cp.LAYOUTS}
    assert scores["contiguous"] == [36, 72, 108, 144]  # r + 1 blocks of 6 x 6
    assert scores["zigzag"] == [81] * 4  # 9 of the 2 x 8 chunk pairs of 3 x 3: chunk r and 7 - r
    pos = torch.arange(4)
    s, computed = cp.block_scores(q[:, :4], k[:, 4:8], pos, pos + 4, causal=True)
    assert s is None and computed == 0  # keys wholly after the queries
    s, computed = cp.block_scores(q[:, :4], k[:, :4], torch.tensor([0, 1, 6, 7]),
                                  torch.tensor([2, 3, 4, 5]), causal=True, chunks=2)
    assert computed == 2 * (2 * 2)  # queries 6, 7 see both key chunks; 0, 1 see neither
    assert torch.isinf(s[:, :2]).all() and torch.isfinite(s[:, 2:]).all()


@pytest.mark.parametrize("ranks, causal", [(2, False), (2, True), (4, True)])
def test_ulysses_on_ranks_is_one_process_attention(ranks, causal):
    q, k, v, d_out = qkv()
    results = launch(cp.run_context_parallel, ranks, args=(q, k, v, d_out),
                     kwargs=dict(causal=causal, kind="ulysses"))
    out, dq, dk, dv = reference(q, k, v, d_out, causal)
    for name, whole in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        torch.testing.assert_close(cp.gather_sequence([r[name] for r in results]), whole)
    share = HEADS * TOKENS // ranks * DIM * 8  # bytes of one rank's q (or k, v, output)
    for r in results:  # q, k, v to heads and the output back (forward; backward as many again)
        assert r["counts"]["messages"] == 4
        assert r["counts"]["bytes"] == context_parallel_bytes(share, ranks, "ulysses")
        assert r["layout"] == "contiguous"


def test_ulysses_refuses_heads_that_do_not_divide_among_the_ranks():
    q, k, v, d_out = qkv(heads=3)
    with pytest.raises(Exception, match="3 heads do not divide among 2 ranks"):
        launch(cp.run_context_parallel, 2, args=(q, k, v, d_out), kwargs=dict(kind="ulysses"))


def paced_ring(q, k, v, d_out, overlap, group=None):
    """On each rank: ring attention's forward on an emulated device, once counted and once paced,
    then forward and backward without it; ``overlap`` or waiting for each block first."""
    import torch.distributed as dist

    from course_lib.runtime.emulation import EmulatedDevice, paced_step

    p, r = dist.get_world_size(group), dist.get_rank(group)
    mine = [cp.split_sequence(x, p, r) for x in (q, k, v, d_out)]
    emulated, outs = EmulatedDevice(1e9), []
    with torch.no_grad():
        for _ in range(2):
            with paced_step(emulated):
                outs.append(cp.ring_attention(*mine[:3], group=group, emulated=emulated,
                                              overlap=overlap))
    q_, k_, v_ = (x.clone().requires_grad_(True) for x in mine[:3])
    out = cp.ring_attention(q_, k_, v_, group=group, overlap=overlap)
    out.backward(mine[3])
    return {"paced": outs, "pieces": emulated.pieces, "seconds": emulated.device_seconds,
            "out": out.detach(), "dq": q_.grad, "dk": k_.grad, "dv": v_.grad}


@pytest.mark.parametrize("ranks, overlap", [(2, False), (4, True), (4, False)])
def test_ring_attention_paced_or_waiting_for_each_block_is_one_process_attention(ranks, overlap):
    q, k, v, d_out = qkv()
    results = launch(paced_ring, ranks, args=(q, k, v, d_out, overlap))
    out, dq, dk, dv = reference(q, k, v, d_out, False)
    for name, whole in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        torch.testing.assert_close(cp.gather_sequence([r[name] for r in results]), whole)
    for paced in range(2):
        torch.testing.assert_close(cp.gather_sequence([r["paced"][paced] for r in results]), out)
    n = TOKENS // ranks
    block = 2 * HEADS * n * n * DIM * 2  # scores and their weighted sum of values: two products
    for r in results:  # a pacing point before and after each of the p blocks
        assert r["pieces"] == [0] + [block, 0] * (ranks - 1) + [block, 0]
        assert r["seconds"] == pytest.approx(ranks * block / 1e9)  # the paced run only


def ring_order(q, k, v, overlap, group=None):
    """On each rank: the order of ring attention's forward, each block's compute and each wait
    for a message (the module's isend, irecv and block_scores wrapped to log them)."""
    import torch.distributed as dist

    log, isend, irecv, scores = [], dist.isend, dist.irecv, cp.block_scores

    class Logged:
        def __init__(self, work):
            self.work = work

        def wait(self):
            log.append("wait")
            return self.work.wait()

    def logged_scores(*args, **kwargs):
        log.append("compute")
        return scores(*args, **kwargs)

    dist.isend = lambda *a, **kw: Logged(isend(*a, **kw))
    dist.irecv = lambda *a, **kw: Logged(irecv(*a, **kw))
    cp.block_scores = logged_scores
    try:
        p, r = dist.get_world_size(group), dist.get_rank(group)
        cp.ring_attention(*(cp.split_sequence(x, p, r) for x in (q, k, v)), group=group,
                          overlap=overlap)
    finally:
        dist.isend, dist.irecv, cp.block_scores = isend, irecv, scores
    return log


def test_with_overlap_a_block_computes_before_its_successor_is_waited_for_and_not_without():
    q, k, v, _ = qkv()
    for overlap, order in ((True, ["compute", "wait", "wait"] * 2 + ["compute"]),
                           (False, ["wait", "wait", "compute"] * 2 + ["compute"])):
        assert launch(ring_order, 3, args=(q, k, v, overlap)) == [order] * 3


def test_ring_attention_refuses_to_pace_a_gpu():
    from course_lib.runtime.emulation import EmulatedDevice

    q = torch.zeros(2, 4, 8, device="meta")
    with pytest.raises(ValueError, match="emulated device stands in for an accelerator"):
        cp.ring_attention(q, q, q, emulated=EmulatedDevice(1e9))


@pytest.mark.parametrize("block", [2.5, float("nan"), True, "4", -1])
def test_blockwise_attention_refuses_a_block_that_is_no_positive_whole_number(block):
    q, k, v, _ = qkv()
    with pytest.raises(ValueError, match="block must be a positive number of keys, a whole"):
        cp.blockwise_attention(q, k, v, block)


def test_blockwise_attention_refuses_keys_and_values_that_do_not_pair_up():
    q, k, v, _ = qkv()
    with pytest.raises(ValueError, match="k and v need one row per key each"):
        cp.blockwise_attention(q, k, v[:, :-3], 5)  # was an IndexError
    with pytest.raises(ValueError, match="v's as wide as q's"):
        cp.blockwise_attention(q, k, v[..., :1], 5)  # a width 1 broadcast silently


@pytest.mark.parametrize("causal", [False, True])
def test_blockwise_attention_over_no_keys_is_zeros_as_torch_gives(causal):
    q, k, v, _ = qkv()
    out = cp.blockwise_attention(q, k[:, :0], v[:, :0], 4, causal)  # was NaN
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k[:, :0], v[:, :0]))
    assert out.shape == q.shape and not out.abs().sum()


def test_the_online_softmax_refuses_a_result_before_any_scores():
    q = torch.ones(2, 3, 4)
    with pytest.raises(ValueError, match=r"result\(\) before any add\(\)"):
        cp.OnlineSoftmax(q).result()  # was NaN, silently


def test_positions_and_splits_refuse_what_is_no_whole_number_or_has_no_token_dim():
    import numpy as np

    with pytest.raises(ValueError, match="tokens, world_size and rank must be whole numbers"):
        cp.sequence_positions(8, 2, 0.5)  # used to return positions 4.0, 5.0, ...
    with pytest.raises(ValueError, match="tokens, world_size and rank must be whole numbers"):
        cp.sequence_positions(8.0, 2, 1)
    assert cp.sequence_positions(np.int64(8), np.int64(2), np.int64(1)).tolist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="x must hold its tokens on dim -2"):
        cp.split_sequence(torch.arange(8.0), 2, 0)  # an IndexError


def test_gather_sequence_refuses_no_parts_and_parts_of_different_shapes():
    with pytest.raises(ValueError, match="parts must be every rank's share"):
        cp.gather_sequence([])  # an IndexError
    q, *_ = qkv()
    parts = [cp.split_sequence(q, 2, r) for r in range(2)]
    torch.testing.assert_close(cp.gather_sequence(parts), q)
    with pytest.raises(ValueError, match=r"all of one shape \(equal shares\)"):
        cp.gather_sequence([parts[0], parts[1][:1]])  # one head: broadcast to all, silently
    with pytest.raises(ValueError, match=r"all of one shape \(equal shares\)"):
        cp.gather_sequence([parts[0], parts[1][:, :1]])  # unequal shares: no split makes them
