"""Edge inputs across the lecture modules: each works as torch (or one process) does, or is
refused with a message naming the problem (found by reviews that tried odd arguments)."""

import math

import pytest
import torch

from course_lib import WorkerError, launch
from course_lib import compression as cm
from course_lib import context_parallel as cp
from course_lib import experts as ex
from course_lib import interleaving as il
from course_lib import quantization as qz
from course_lib.fl_remedies import ControlVariates
from course_lib.fp8_training import FP8Linear
from course_lib.number_formats import FORMATS, update_is_lost
from course_lib.pipelining import run_torch_pipeline
from course_lib.sharding import fsdp_parameter_bytes


def three_pieces():
    torch.manual_seed(0)
    return [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()) for _ in range(2)] + [
        torch.nn.Sequential(torch.nn.Linear(4, 3))]


def test_torchs_pipeline_wants_one_piece_per_rank():
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 2, 0])
    for pieces in (three_pieces(), three_pieces()[:1]):  # 3 used to run as 2, 1 an IndexError
        with pytest.raises(WorkerError, match=f"{len(pieces)} pieces for 2 ranks: one piece"):
            launch(run_torch_pipeline, 2, args=(pieces, x, y, 2))


def uneven_rows():
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))


def test_fsdp_gradients_count_as_sharded_when_rows_split_unevenly():
    # 7 rows over 2 ranks: 4 and 3; rank 0 holds 20 of 35 weights, more than ceil(35 / 2)
    results = launch(fsdp_parameter_bytes, 2, args=(uneven_rows,))
    assert [r["grads_sharded"] for r in results] == [True, True]


def test_fp8_keeps_inf_and_nan_where_nn_linear_does():
    torch.manual_seed(0)
    linear = torch.nn.Linear(2, 1)
    fp8 = FP8Linear(linear)
    fp8(torch.ones(1, 2)).backward(torch.tensor([[math.inf]]))
    linear(torch.ones(1, 2)).backward(torch.tensor([[math.inf]]))
    assert torch.isinf(fp8.weight.grad).all() and torch.isinf(linear.weight.grad).all()
    assert not torch.isfinite(fp8(torch.tensor([[math.inf, 1.0]]))).any()  # no finite -274.7


def int8_sums(group=None):
    import torch.distributed as dist
    rank, said = dist.get_rank(), []
    empty = qz.quantized_all_reduce(torch.zeros(0, 3), group=group)["sum"]
    for call in (lambda: qz.quantized_all_reduce(torch.tensor([1, 2, 3]) * (rank + 1)),
                 lambda: qz.compressed_all_reduce(torch.ones(2), "int4")):
        try:
            call()
        except ValueError as why:
            said.append(str(why))
    return tuple(empty.shape), said


def test_int8_all_reduce_takes_an_empty_tensor_and_refuses_integers_and_unknown_methods():
    shape, said = launch(int8_sums, 2)[0]
    assert shape == (0, 3)
    assert said[0].startswith("int8 codes quantise floating-point gradients, got torch.int64")
    assert said[1].startswith("unknown method 'int4': use one of ('fp32'")


def test_scaffold_refuses_what_it_would_divide_by_zero():
    with pytest.raises(ValueError, match="clients .* at least 1, got 0"):
        ControlVariates(3, 0)
    w = torch.zeros(3, dtype=torch.float64)
    for steps, lr in ((0, 0.1), (2, 0.0)):
        with pytest.raises(ValueError, match="needs at least one step and lr above 0"):
            ControlVariates(3, 2).update(0, w, w + 1, steps=steps, lr=lr)


def test_ring_attention_on_one_rank_equals_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v, d_out = (torch.randn(2, 8, 4, generator=g, dtype=torch.float64) for _ in range(4))
    (one,) = launch(cp.run_context_parallel, 1, args=(q, k, v, d_out),
                    kwargs=dict(causal=True, kind="ring"))
    q_, k_, v_ = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
    out.backward(d_out)
    for got, want in zip((one["out"], one["dq"], one["dk"], one["dv"]),
                         (out.detach(), q_.grad, k_.grad, v_.grad), strict=True):
        torch.testing.assert_close(got, want)
    assert one["counts"]["messages"] == 0


def test_frozen_router_and_expert_parameters_get_no_gradient_as_in_torch():
    layer = ex.MixtureOfExperts(d_model=8, d_hidden=16, num_experts=2, k=1, dtype=torch.float64)
    layer.router.weight.requires_grad_(False)
    next(layer.experts[0].parameters()).requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    x, d_out = (torch.randn(8, 8, generator=g, dtype=torch.float64) for _ in range(2))
    results = launch(ex.run_expert_parallel, 2, args=(layer, x, d_out))
    assert all(r["router_grad"] is None for r in results)
    held = [grads for r in results for grads in r["expert_grads"]]
    assert sum(grad is None for grads in held for grad in grads) == 1  # expert 0's first weight


def interleaved_with_a_frozen_bias(micro_batches):
    torch.manual_seed(0)
    pieces = [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()) for _ in range(3)] + [
        torch.nn.Sequential(torch.nn.Linear(4, 3))]
    pieces[1][0].bias.requires_grad_(False)
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 2, 0])
    return il.run(pieces, x, y, micro_batches), il.Padded(torch.nn.ReLU(), 0.0, 0.0).one.dtype


def test_interleaving_leaves_frozen_gradients_none_and_refuses_impossible_micro_batches():
    (first, dtype), (second, _) = launch(interleaved_with_a_frozen_bias, 2, args=(2,))
    grads = first["grads"] + second["grads"]
    assert sum(g is None for piece in grads for g in piece) == 1 and dtype == torch.float32
    for m in (0, -2, 3, 1.5):
        with pytest.raises(ValueError, match=f"does not divide into {m!r} equal micro-batches"):
            il.check_micro_batches(4, m)


def power_sgd_of_vectors_only(group=None):
    out, n_bytes, _ = cm.PowerSGD(2).all_reduce([torch.ones(3), torch.ones(2, 0)], group)
    return out, n_bytes


def test_power_sgd_sends_vectors_alone_and_top_k_names_its_range():
    out, n_bytes = launch(power_sgd_of_vectors_only, 2)[0]
    torch.testing.assert_close(out[0], torch.ones(3))
    assert out[1].shape == (2, 0) and n_bytes == 3 * 4
    with pytest.raises(ValueError, match="fraction must be a number in"):
        cm.compressor("top-k -5%")


def test_fp8_counts_only_finite_values_as_saturated():
    import numpy as np

    from course_lib.fp8_training import DelayedScaling
    scaler = DelayedScaling(margin=np.int64(0), scaled=False)
    scaler.cast(torch.tensor([math.inf, 1e6, 1.0]))
    assert scaler.saturated == 1  # 1e6 saturates; inf stays inf


def power_sgd_in_half(group=None):
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(6, 4, generator=g).half(), torch.randn(3, generator=g).half(),
             torch.zeros(0, 3).half()]
    out, _, _ = cm.PowerSGD(4).all_reduce(grads, group)
    return grads, out


def test_power_sgd_takes_16_bit_and_empty_gradients():
    grads, out = launch(power_sgd_in_half, 2)[0]  # every rank the same: the mean is each one
    assert [o.dtype for o in out] == [torch.float16] * 3 and out[2].shape == (0, 3)
    torch.testing.assert_close(out[0], grads[0], atol=0.02, rtol=0.02)  # rank 4 of a 6 x 4: exact
    torch.testing.assert_close(out[1], grads[1])


def test_a_lost_update_is_judged_in_every_format_of_the_table():
    assert update_is_lost(1.0, 0.01, FORMATS["fp8 e4m3"]) and not update_is_lost(
        1.0, 0.2, FORMATS["fp8 e4m3"])  # e4m3 steps by 1/8 near 1
    assert update_is_lost(1.0, 2.0 ** -12, FORMATS["fp16"])
    assert not update_is_lost(1.0, 2.0 ** -10, FORMATS["fp16"])



def test_sizes_that_mean_nothing_are_refused_by_name():
    import numpy as np

    from course_lib import message_trees as mt
    from course_lib.data import shard_rows
    from course_lib.erm import diabetes_problem
    from course_lib.erm_simulators import fedavg_losses
    from course_lib.fl_remedies import fedadam_server
    from course_lib.fp8_training import DelayedScaling
    from course_lib.recomputation import peak_activation_bytes, step_seconds
    for call, said in ((lambda: mt.broadcast_schedule(0, "star"), "p .ranks. must be a whole"),
                       (lambda: mt.words_per_iteration(3, -5, "star"), "d .words of w. must be"),
                       (lambda: mt.tree_links(7, 3, "tree"), "rank must be one of the p = 3"),
                       (lambda: fedadam_server(betas=(1.5, 0.9)), r"betas must be two numbers"),
                       (lambda: shard_rows(10, 2, seed=2.5), "seed must be None .* or a whole"),
                       (lambda: fedavg_losses(diabetes_problem(), shard_rows(442, 2), 1, 0.1, -1),
                        "rounds must be a whole number of at least 0"),
                       (lambda: cm.compressor("top-k abc%"), "unknown compressor 'top-k abc%'"),
                       (lambda: qz.to_fp8(torch.ones(2), torch.int8), "must be an fp8 format"),
                       (lambda: step_seconds(torch.nn.Linear(2, 2), torch.ones(1, 2),
                                             torch.tensor([0]), repeats=0), "repeats must be")):
        with pytest.raises(ValueError, match=said):
            call()
    assert DelayedScaling(history=np.int64(4)).history == 4  # numpy's whole numbers count
    no_blocks = [peak_activation_bytes(8, 16, 0, 4, 100, ckpt) for ckpt in (True, False)]
    assert no_blocks[0] == no_blocks[1]  # no block to recompute: nothing more at the peak


def ulysses_on_a_batch(group=None):
    from course_lib.ulysses import ulysses_attention
    x = torch.zeros(2, 4, 8, 4)  # (batch, heads, tokens, d): the batch would be read as heads
    try:
        ulysses_attention(x, x, x, group=group)
    except ValueError as why:
        return str(why)


def test_ulysses_refuses_a_batch_dimension_and_a_gradient_of_more_rows_than_the_digits():
    assert launch(ulysses_on_a_batch, 2)[0].startswith("Ulysses takes (heads, tokens, d) tensors")
    with pytest.raises(WorkerError, match="rows per rank must be a whole number from 1 to"):
        launch(qz.sum_one_gradient, 2, kwargs=dict(rows=1000))


def test_secure_aggregation_masks_refuse_negative_or_fractional_sizes():
    from course_lib import fl_security as sec
    for args in ((0, 1, -1), (0, 1.5, 3), (1, 0, 3)):
        with pytest.raises(ValueError, match=r"pair_mask\(i, j\) is the mask of clients"):
            sec.pair_mask(*args)
    with pytest.raises(ValueError, match="clients must be a whole number of at least 1"):
        sec.pairwise_masks(-1, 4)
    assert sec.pairwise_masks(3, 4).sum(dim=0).abs().max() < 1e-9  # they cancel
