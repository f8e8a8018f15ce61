"""Exercise checks (course_lib.exercises) explain what is wrong, rank by rank."""

import pytest
import torch

from course_lib.exercises import ExerciseFailed, check_gradient, check_rank_results


def test_correct_results_pass():
    assert "all 2 ranks" in check_rank_results([3.0, 3.0], 3.0, "the sum")
    check_rank_results([torch.tensor([1.0]), torch.tensor([2.0])],
                       [torch.tensor([1.0]), torch.tensor([2.0])], per_rank=True)
    check_rank_results([[0, 1], [0, 1]], [0, 1])


def test_wrong_rank_is_named_with_what_it_held_and_what_was_expected():
    with pytest.raises(ExerciseFailed, match=r"rank 1 ended with 2\.0 but the sum is 3\.0"):
        check_rank_results([3.0, 2.0], 3.0, "the sum")


def test_per_rank_expectations_name_the_wrong_rank():
    with pytest.raises(ExerciseFailed, match="rank 0 ended with 1 but the rank is 0"):
        check_rank_results([1, 1], [0, 1], "the rank", per_rank=True)


def test_wrong_number_of_ranks_and_wrong_type():
    with pytest.raises(ExerciseFailed, match="world_size"):
        check_rank_results([1, 1, 1], [1, 1], per_rank=True)
    with pytest.raises(ExerciseFailed, match="one entry per rank"):
        check_rank_results(3.0, 3.0)
    with pytest.raises(ExerciseFailed):
        check_rank_results([torch.ones(2)], torch.ones(3))


def test_check_gradient_accepts_the_right_gradient():
    g = torch.randn(3, 4, dtype=torch.float64)
    assert "correct" in check_gradient("dW", g.clone(), g)


def test_check_gradient_names_missing_return_shape_and_worst_entry():
    g = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ExerciseFailed, match="forget to return"):
        check_gradient("dK", None, g)
    with pytest.raises(ExerciseFailed, match=r"shape \(3, 2\).*\(2, 3\)"):
        check_gradient("dK", g.T, g, case="batch 1")
    wrong = g.clone()
    wrong[1, 2] = 0.5
    with pytest.raises(ExerciseFailed, match=r"largest difference 0.5 at index \(1, 2\)"):
        check_gradient("dK", wrong, g)
    with pytest.raises(ExerciseFailed):
        check_gradient("dK", g * float("nan"), g)


def test_check_staleness_aware_lr_accepts_alpha_over_tau_and_names_mistakes():
    from course_lib.async_sgd import staleness_aware_lr
    from course_lib.exercises.lesson06 import check_staleness_aware_lr

    assert check_staleness_aware_lr(staleness_aware_lr).startswith("correct")
    with pytest.raises(ExerciseFailed, match="divides by zero"):
        check_staleness_aware_lr(lambda alpha, tau: alpha / tau)
    with pytest.raises(ExerciseFailed, match=r"rule\(0.1, 1\) = 0.05 but should be 0.1"):
        check_staleness_aware_lr(lambda alpha, tau: alpha / (tau + 1))
    with pytest.raises(ExerciseFailed, match="return a number"):
        check_staleness_aware_lr(lambda alpha, tau: None)


def test_check_update_scale_accepts_the_rule_and_explains_a_missing_reset():
    from course_lib.exercises.lesson07 import check_update_scale
    from course_lib.loss_scaling import update_scale

    assert check_update_scale(update_scale).startswith("correct")

    def no_reset(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval):
        if found_inf:
            return scale * backoff_factor, tracker  # forgets to restart the count
        return update_scale(scale, tracker, False, growth_factor=growth_factor,
                            backoff_factor=backoff_factor, growth_interval=growth_interval)

    with pytest.raises(ExerciseFailed, match="tracker back to 0"):
        check_update_scale(no_reset)
    with pytest.raises(ExerciseFailed, match="return \\(scale, growth_tracker\\)"):
        check_update_scale(lambda *args, **kwargs: 1.0)


def test_check_stochastic_round_rejects_deterministic_and_biased_rounding():
    from course_lib.exercises.lesson07 import check_stochastic_round
    from course_lib.quantization import stochastic_round

    assert check_stochastic_round(stochastic_round).startswith("correct")
    with pytest.raises(ExerciseFailed, match="deterministic"):
        check_stochastic_round(lambda x, g: torch.round(x))
    with pytest.raises(ExerciseFailed, match="biased"):
        check_stochastic_round(lambda x, g: torch.floor(x + 0.5 * torch.rand(x.shape,
                                                                            generator=g,
                                                                            dtype=x.dtype)))
    with pytest.raises(ExerciseFailed, match="same shape"):
        check_stochastic_round(lambda x, g: None)


def test_check_weighted_average_explains_the_plain_mean():
    from course_lib.exercises.lesson08 import check_weighted_average

    def weighted(models, sizes):
        return sum(n / sum(sizes) * w for n, w in zip(sizes, models, strict=True))

    assert check_weighted_average(weighted).startswith("correct")
    with pytest.raises(ExerciseFailed, match="plain mean"):
        check_weighted_average(lambda models, sizes: torch.stack(models).mean(dim=0))
    with pytest.raises(ExerciseFailed, match="None"):
        check_weighted_average(lambda models, sizes: None)


def test_check_label_shards_accepts_the_library_and_names_mixed_shards():
    import numpy as np

    from course_lib.exercises.lesson08 import check_label_shards
    from course_lib.partitions import iid, label_shards

    labels = np.repeat(np.arange(10), 30)
    assert check_label_shards(lambda y, k, s: label_shards(y, k, seed=s), labels).startswith(
        "correct")
    with pytest.raises(ExerciseFailed, match="labels"):
        check_label_shards(lambda y, k, s: iid(y, k, seed=s), labels)
    with pytest.raises(ExerciseFailed, match="belong to no client"):
        check_label_shards(lambda y, k, s: [p[:-1] for p in label_shards(y, k, seed=s)], labels)


def test_check_trimmed_mean_and_pairwise_masks_accept_the_library():
    from course_lib import fl_security
    from course_lib.exercises.lesson09 import check_pairwise_masks, check_trimmed_mean

    reference = lambda updates, trim: fl_security.trimmed_mean(updates, trim=trim)  # noqa: E731
    assert check_trimmed_mean(reference).startswith("correct")
    with pytest.raises(ExerciseFailed, match="trimmed mean is"):
        check_trimmed_mean(lambda u, trim: u.mean(dim=0))
    assert check_pairwise_masks(fl_security.pairwise_masks).startswith("correct")
    with pytest.raises(ExerciseFailed, match="do not cancel"):
        check_pairwise_masks(lambda k, d, s: torch.randn(k, d))
    with pytest.raises(ExerciseFailed, match="nearly"):
        check_pairwise_masks(lambda k, d, s: torch.zeros(k, d))


def test_check_half_latency_size_names_the_two_parts():
    from course_lib.exercises.lesson03 import check_half_latency_size

    assert check_half_latency_size(lambda a, b, p: p * a / b).startswith("correct")
    with pytest.raises(ExerciseFailed, match="latency part"):
        check_half_latency_size(lambda a, b, p: a / b)
    with pytest.raises(ExerciseFailed, match="None"):
        check_half_latency_size(lambda a, b, p: None)


def test_check_large_batch_lr_and_1f1b_order_accept_the_library_and_explain_mistakes():
    from course_lib import data_parallel as dp
    from course_lib import pipeline as pp
    from course_lib.exercises.lesson04 import check_large_batch_lr
    from course_lib.exercises.lesson05 import check_1f1b_order

    def right_lr(step, base_lr, base_batch, batch, warmup_steps):
        target = dp.linear_scaling_lr(base_lr, base_batch, batch)
        return dp.warmup_lr(step, target, warmup_steps, base_lr) if warmup_steps else target

    assert check_large_batch_lr(right_lr).startswith("correct")
    with pytest.raises(ExerciseFailed, match="the schedule gives"):
        check_large_batch_lr(lambda step, lr, b0, b, w: lr)
    assert check_1f1b_order(pp.one_f_one_b_schedule).startswith("correct")
    with pytest.raises(ExerciseFailed, match="should be"):
        check_1f1b_order(pp.gpipe_schedule)
