"""The course's closed-form predictions (course_lib.cost_models), checked on hand-worked cases."""

import math

import numpy as np
import pytest
import torch

from course_lib import cost_models as M


def test_amdahl_and_gustafson():
    assert M.amdahl_speedup(4, 1.0) == pytest.approx(4.0)
    assert M.amdahl_speedup(4, 0.0) == pytest.approx(1.0)
    assert M.amdahl_speedup(2, 0.5) == pytest.approx(1 / (0.5 + 0.25))
    assert M.gustafson_speedup(4, 0.5) == pytest.approx(0.5 + 2.0)
    assert M.gustafson_speedup(1, 0.3) == pytest.approx(1.0)
    for law in (M.amdahl_speedup, M.gustafson_speedup):  # 1.5 would give a negative speedup
        for f in (1.5, -0.1, float("nan"), [0.5, 1.2]):
            with pytest.raises(ValueError, match=r"f \(the parallel share\) is a share: from 0"):
                law(4, f)
    with pytest.raises(ValueError, match=r"q \(a probability\) is a share"):
        M.probability_any_fails(3, -0.5)
    assert float(M.probability_any_fails(3, 0.5)) == pytest.approx(1 - 0.5 ** 3)


def test_fit_amdahl_recovers_f_and_refuses_nonsense():
    p = [1, 2, 4, 8]
    assert M.fit_amdahl(p, M.amdahl_speedup(p, 0.8)) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="Amdahl's f needs a run on more than one process"):
        M.fit_amdahl([1, 1], [1.0, 1.0])  # one process: every f fits
    with pytest.raises(ValueError):
        M.fit_amdahl([1, 2], [1.0])


def test_fit_gustafson_recovers_f():
    p = [1, 2, 4, 8]
    assert M.fit_gustafson(p, M.gustafson_speedup(p, 0.6)) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="Gustafson's f needs a run on more than one process"):
        M.fit_gustafson([1], [1.0])
    with pytest.raises(ValueError):
        M.fit_gustafson([1, 2], [1.0])


def test_probability_any_fails_is_one_minus_all_survive():
    assert M.probability_any_fails(50, 0.01).item() == pytest.approx(1 - 0.99 ** 50)
    assert M.probability_any_fails(1, 0.3).item() == pytest.approx(0.3)


def test_alpha_beta_fit_recovers_a_linear_cost_and_needs_three_points():
    n = torch.tensor([8.0, 1e3, 1e5, 1e7])
    alpha, beta = M.fit_alpha_beta(n, M.alpha_beta_time(n, 5e-4, 1e-9))
    assert alpha == pytest.approx(5e-4, rel=1e-6) and beta == pytest.approx(1e-9, rel=1e-6)
    with pytest.raises(ValueError, match="at least 3"):
        M.fit_alpha_beta([1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="a time for each size"):
        M.fit_alpha_beta([1.0, 2.0, 3.0], [1.0, 2.0])


def test_alpha_beta_fit_in_seconds_adds_up_to_the_messages_measured_total():
    # a stream of messages: most take alpha + beta n, one in eight ten times as long
    n = torch.tensor([1e3, 1e4, 1e5, 1e6] * 8, dtype=torch.float64)
    t = M.alpha_beta_time(n, 5e-4, 1e-9) * torch.where(torch.arange(32) % 8 == 3, 10.0, 1.0)
    alpha, beta = M.fit_alpha_beta(n, t, relative=False)
    assert (alpha * len(n) + beta * n.sum()).item() == pytest.approx(t.sum().item(), rel=1e-9)
    # the relative fit follows the typical message instead, and falls short of the total
    alpha_r, beta_r = M.fit_alpha_beta(n, t)
    assert (alpha_r * len(n) + beta_r * n.sum()).item() < 0.9 * t.sum().item()


def test_all_reduce_bytes_per_algorithm():
    n = 1200
    assert M.all_reduce_bytes("efficient ring", n, 4) == pytest.approx(2 * 3 / 4 * n)
    assert M.all_reduce_bytes("reduce + broadcast", n, 4) == 3 * n
    assert M.all_reduce_bytes("all-to-all", n, 4) == 3 * n
    assert M.all_reduce_bytes("naive ring", n, 4) == 2 * n
    assert M.all_reduce_bytes("naive ring", n, 2) == n
    assert M.all_reduce_bytes("efficient ring", n, 1) == 0
    with pytest.raises(ValueError, match="unknown algorithm"):
        M.all_reduce_bytes("tree", n, 4)


def test_ring_time_and_bus_bandwidth():
    assert M.ring_all_reduce_time(1000, 2, 1.0, 0.001) == pytest.approx(2 + 1.0)
    assert M.bus_bandwidth(1e9, 1.0, 4) == pytest.approx(1.5e9)
    assert M.bus_bandwidth(1e9, 1.0, 4, "all_gather") == pytest.approx(0.75e9)
    with pytest.raises(ValueError):
        M.bus_bandwidth(1, 1, 2, "broadcast")


def test_parameter_server_words_star_and_tree():
    assert M.parameter_server_words(8, 10, "star") == 2 * 10 * 7
    assert M.parameter_server_words(8, 10, "tree") == 2 * 10 * 3
    assert M.parameter_server_words(1, 10, "tree") == 0
    with pytest.raises(ValueError):
        M.parameter_server_words(4, 10, "ring")


def test_parameter_server_epoch_seconds_sync_waits_async_adds_rates():
    # 4 workers, one 8x slower: sync runs at the straggler's pace, async at the sum of rates
    c, r = [0.01, 0.01, 0.01, 0.08], 0.002
    sync = M.parameter_server_epoch_seconds(640, 16, c, r, "sync")
    assert sync == pytest.approx(640 / (4 * 16) * (0.08 + r))
    rate = 3 / (0.01 + r) + 1 / (0.08 + r)
    assert M.parameter_server_epoch_seconds(640, 16, c, r, "async") == pytest.approx(40 / rate)
    assert M.async_staleness(5) == 4 and M.async_staleness(5, slowdown=8) == 32
    with pytest.raises(ValueError, match="need a batch of 1 row or more"):
        M.parameter_server_epoch_seconds(640, 0, c, r, "sync")


def test_bulk_synchronous_timeline_waits_for_the_slowest():
    spans = M.bulk_synchronous_timeline([1.0, 3.0], 0.5, iterations=2)
    idle = [s for s in spans if s.kind.startswith("idle")]
    assert [s.lane for s in idle] == [0, 0]
    assert [x for s in idle for x in (s.start, s.duration)] == pytest.approx([1.0, 2.0, 4.5, 2.0])
    assert max(s.start + s.duration for s in spans) == pytest.approx(2 * 3.5)


def test_pipeline_bubble_plain_and_interleaved():
    assert M.bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert M.bubble_fraction(1, 8) == pytest.approx(0.0)
    assert M.bubble_fraction(4, 8, chunks=3) == pytest.approx(1 / (8 + 1))
    with pytest.raises(ValueError):
        M.bubble_fraction(0, 4)
    for args in ((2.5, 4), (float("nan"), 4), (4, 4, 0)):
        with pytest.raises(ValueError, match="whole numbers >= 1"):
            M.bubble_fraction(*args)


def test_zero_bytes_per_rank_follow_the_paper():
    psi = 7.5e9
    assert M.zero_bytes_per_rank(psi, 64, 0) == 16 * psi  # 120 GB
    assert M.zero_bytes_per_rank(psi, 64, 1) == pytest.approx(4 * psi + 12 * psi / 64)
    assert M.zero_bytes_per_rank(psi, 64, 2) == pytest.approx(2 * psi + 14 * psi / 64)
    assert M.zero_bytes_per_rank(psi, 64, 3) == pytest.approx(16 * psi / 64)
    with pytest.raises(ValueError):
        M.zero_bytes_per_rank(psi, 4, 4)


def test_megatron_two_all_reduces_per_block_on_the_ring():
    assert M.megatron_all_reduces(3) == {"forward": 3, "backward": 3}
    n = 8 * 16 * 4  # 8 tokens x d_model 16, float32
    assert M.megatron_bytes(8, 16, 2) == pytest.approx(2 * (2 * 1 / 2 * n))


def test_federated_bytes_and_quantized_error_bound():
    assert M.federated_bytes_per_round(10, 100) == 2 * 10 * 100 * 4
    assert M.federated_bytes_per_round(10, 100, messages=2) == 2 * 2 * 10 * 100 * 4
    assert M.quantized_sum_error_bound(4, 0.5) == pytest.approx(2.0)
    assert M.quantized_sum_error_bound(4, 0.5, stochastic=False) == pytest.approx(1.0)
    assert math.isclose(M.quantized_sum_error_bound(1, 1.0), 1.0)


def test_an_all_to_all_sends_p_minus_1_slices_of_n_over_p():
    assert M.all_to_all_time(400, 4, 1.0, 0.01) == pytest.approx(3 * (1 + 1))
    assert M.all_to_all_time(400, 1, 1.0, 0.01) == 0
    assert M.expert_parallel_time(400, 4, 1.0, 0.01) == pytest.approx(12)


def test_ring_attention_hides_its_messages_under_blocks_that_take_longer():
    # messages alone: p - 1 steps of alpha + beta 2n
    assert M.ring_attention_time(100, 4, 1.0, 0.01) == pytest.approx(3 * 3.0)
    assert M.ring_attention_time(100, 4, 1.0, 0.01, block_seconds=5.0) == pytest.approx(4 * 5.0)
    assert M.ring_attention_time(100, 4, 1.0, 0.01, block_seconds=2.0) == pytest.approx(2 + 9)
    # several sizes at once, as ulysses_time takes them (it used to fail: "ambiguous")
    assert M.ring_attention_time(np.array([100, 400]), 4, 1.0, 0.01, block_seconds=5.0).tolist() \
        == pytest.approx([4 * 5.0, 5 + 3 * 9.0])


def test_ulysses_sends_two_over_p_of_the_rings_bytes_in_four_times_the_messages():
    for p in (2, 4, 8):
        ring, ulysses = (M.context_parallel_bytes(1000, p, k) for k in M.CONTEXT_PARALLEL)
        assert ring / ulysses == pytest.approx(p / 2)
    assert M.ulysses_time(800, 4, 1.0, 0.01) == pytest.approx(4 * 3 * (1 + 2))
    with pytest.raises(ValueError, match="kind must be one of"):
        M.context_parallel_bytes(1000, 4, "zigzag")


@pytest.mark.parametrize("p", [3, 4, 8, 64])
def test_at_the_crossover_ring_and_ulysses_take_equal_time(p):
    alpha, beta = 20e-6, 1 / 10e9
    n = M.ring_ulysses_crossover(p, alpha, beta)
    assert M.ring_attention_time(n, p, alpha, beta) == pytest.approx(M.ulysses_time(n, p, alpha,
                                                                                     beta))
    assert M.ring_attention_time(n / 2, p, alpha, beta) < M.ulysses_time(n / 2, p, alpha, beta)
    assert M.ring_attention_time(2 * n, p, alpha, beta) > M.ulysses_time(2 * n, p, alpha, beta)
    assert M.ring_ulysses_crossover(2, alpha, beta) == float("inf")
    assert M.ring_ulysses_crossover(p, alpha, 0.0) == float("inf")  # bytes free: the ring wins
    with pytest.raises(ValueError, match="alpha must be zero or more"):
        M.ring_ulysses_crossover(p, -alpha, beta)


@pytest.mark.parametrize("call, message", [
    (lambda: M.ring_attention_time(math.nan, 4, 1e-6, 1e-9), "n_bytes must be zero or more"),
    (lambda: M.ring_attention_time(100, 4, 1e-6, math.nan), "beta must be zero or more"),
    (lambda: M.ring_attention_time(100, 4, 1e-6, 1e-9, -1.0), "block_seconds must be zero or"),
    (lambda: M.all_reduce_bytes("efficient ring", -100, 4), "n_bytes must be zero or more"),
    (lambda: M.alpha_beta_time([1.0, -2.0], 1e-6, 1e-9), "n_bytes must be zero or more"),
    (lambda: M.ring_all_reduce_time(100, 4, -1e-6, 1e-9), "alpha must be zero or more"),
    (lambda: M.zero_bytes_per_rank(-1, 4, 1), "psi must be zero or more"),
    (lambda: M.context_parallel_bytes(-5, 4, "ring"), "n_bytes must be zero or more"),
    (lambda: M.fit_alpha_beta([1, 2, 3], [0, 0, 0]), "needs times above 0"),
    (lambda: M.fit_alpha_beta([1, 2, 3], [1e-3, math.nan, 1e-3]), "needs times above 0"),
    (lambda: M.ring_all_reduce_time(100, True, 0, 1e-9), "number of processes"),
    (lambda: M.ring_all_reduce_time(100, "3", 0, 1e-9), "number of processes"),
    (lambda: M.ring_all_reduce_time(100, math.inf, 0, 1e-9), "number of processes"),
    (lambda: M.bus_bandwidth(100, 0, 4), "seconds must be above 0"),
    (lambda: M.pipeline_timeline(2, 2, "bogus"), "schedule must be one of"),
    (lambda: M.idle_fraction([], 2), "at least one busy span"),
    (lambda: M.pipeline_timeline(2.5, 4), "p must be a whole number of at least 1"),
    (lambda: M.pipeline_timeline(2, 1.5), "micro_batches must be a whole number"),
    (lambda: M.pipeline_timeline(2, 0), "micro_batches must be a whole number"),
    (lambda: M.pipeline_timeline(2, 4, forward=-1.0), "forward must be zero or more"),
    (lambda: M.pipeline_timeline(2, 4, forward=math.nan), "forward must be zero or more"),
    (lambda: M.pipeline_timeline(2, 4, forward=0.0, backward=0.0), "take no time on any stage"),
    (lambda: M.idle_fraction(M.pipeline_timeline(4, 4), 2), "spans use 4 lanes, more than"),
    (lambda: M.idle_fraction([(0, 0.0, 0.0, "forward")], 1), "the spans take no time"),
    (lambda: M.bulk_synchronous_timeline([1.0], 1.0, 2.5), "iterations must be a whole number"),
    (lambda: M.hidden_fraction_model([], [], 1e-6, 1e-9, 1.0), "at least one message"),
    (lambda: M.fit_amdahl([1, 2, 4], [1, 0, 2]), "speedups must be above 0"),
    (lambda: M.fit_gustafson([1, 2, 4], [1, math.nan, 2]), "speedups must be above 0"),
    (lambda: M.bulk_synchronous_timeline([1.0, 2.0], 0.1, -2), "iterations"),
    (lambda: M.bulk_synchronous_timeline([1.0, -2.0], 0.1), "compute_seconds must be zero"),
    (lambda: M.megatron_all_reduces(-1), "blocks must be a whole number"),
    (lambda: M.idle_fraction([(0, 0.0, 1.0, "f"), (0, 0.0, 1.0, "f")], 1),
     "spans on lane 0 overlap"),  # it used to say -1.0
    (lambda: M.idle_fraction([(0, 0.0, -1.0, "f"), (0, 0.0, 2.0, "f")], 1),
     "each span's duration must be zero or more"),
    (lambda: M.parameter_server_words(4, -10, "star"), "d must be zero or more"),
    (lambda: M.parameter_server_words(4, math.nan, "star"), "d must be zero or more"),
    (lambda: M.parameter_server_epoch_seconds(100, 10, [1, -1], 0.1, "sync"),
     "compute_seconds must be zero or more"),
    (lambda: M.parameter_server_epoch_seconds(100, 10, [1, 1], math.nan, "sync"),
     "round_trip must be zero or more"),
    (lambda: M.parameter_server_epoch_seconds(100, 10, [1, 0], 0, "async"),
     "need a time above 0 per mini-batch"),
    (lambda: M.async_staleness(4, -2), "slowdown must be zero or more"),
    (lambda: M.federated_bytes_per_round(3, -5), "d must be zero or more"),
    (lambda: M.quantized_sum_error_bound(4, -1), "scale must be zero or more"),
    (lambda: M.hidden_fraction_model([0, 1], [1, 1], 0.1, 0.01, math.nan),
     "backward must be zero or more"),  # it used to say everything was hidden
    (lambda: M.overlapped_messages([0, math.nan], [1, 1], 0.1, 0.01), "one finite ready time"),
    (lambda: M.overlapped_messages([0, 1], [1, -1], 0.1, 0.01), "n_bytes must be zero or more"),
    (lambda: M.overlapped_messages([0, 1], [1, 1], -0.1, 0.01), "alpha must be zero or more"),
    (lambda: M.fit_alpha_beta([1, 2, math.inf], [1, 2, 3]), "needs finite message sizes"),
    (lambda: M.bubble_fraction(True, 4), "whole numbers >= 1"),
    (lambda: M.pipeline_timeline(4, 4, forward=np.array([1.0, 2.0])), "one time per stage: 4")])
def test_negative_or_nan_sizes_and_times_and_odd_process_counts_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
    # arrays and tensors of sizes still work, element by element
    times = M.alpha_beta_time(np.array([0.0, 1e6]), 1e-6, 1e-9)
    torch.testing.assert_close(times, torch.tensor([1e-6, 1e-3 + 1e-6], dtype=torch.float64))
    idle = [(0, 0.0, 1.0, "f"), (0, 0.0, 0.0, "g")]  # a span of no time overlaps nothing
    assert M.idle_fraction(idle, 1) == M.idle_fraction(idle[::-1], 1) == 0.0
    assert M.pipeline_timeline(np.int64(2), 4) == M.pipeline_timeline(2, 4)  # numpy counts too
    assert M.pipeline_timeline(4, 4, forward=np.array([1.0, 2.0, 1.0, 1.0])) == \
        M.pipeline_timeline(4, 4, forward=[1.0, 2.0, 1.0, 1.0])  # an array, one time a stage


def test_a_bad_argument_is_named_in_megatron_bytes_and_the_overlap_model():
    with pytest.raises(ValueError, match="tokens must be zero or more"):
        M.megatron_bytes(-128, 64, 4)
    with pytest.raises(ValueError, match="2 ready times for 1 messages"):
        M.overlapped_messages([0.0, 1.0], [10], 1.0, 1.0)


@pytest.mark.parametrize("call", [
    lambda n: M.ring_attention_time(n, 2, 1e-6, 1e-9, 1e-6),
    lambda n: M.context_parallel_bytes(n, 3, "ring"),
    lambda n: M.context_parallel_bytes(n, 4, "ulysses"),
    lambda n: M.parameter_server_words(3, n, "star"),
    lambda n: M.federated_bytes_per_round(2, n),
    lambda n: M.async_staleness(3, n),
    lambda n: M.all_to_all_time(n, 4, 1e-6, 1e-9),
    lambda n: M.ulysses_time(n, 4, 1e-6, 1e-9),
    lambda n: M.expert_parallel_time(n, 4, 1e-6, 1e-9),
    lambda n: M.all_reduce_bytes("naive ring", n, 3),
    lambda n: M.all_reduce_bytes("efficient ring", n, 4),
    lambda n: M.zero_bytes_per_rank(n, 4, 1),
    lambda n: M.megatron_bytes(n, 8, 2),
    lambda n: M.bus_bandwidth(n, [1e-3, 2e-3], 2),
    lambda n: M.federated_bytes_per_round([2, 3], 100),
    lambda n: M.quantized_sum_error_bound([2, 3], 0.5),
    lambda n: M.megatron_bytes(128, 64, 4, bytes_per_number=[2, 4]),
], ids=lambda _: "")
def test_a_list_of_sizes_gives_what_an_array_gives(call):
    # 2 * [a, b] is [a, b, a, b]: a list must not reach the arithmetic as it is
    listed, array = call([100.0, 200.0]), call(np.array([100.0, 200.0]))
    np.testing.assert_allclose(np.asarray(listed, dtype=float), np.asarray(array, dtype=float))
    assert np.shape(listed) == (2,)
