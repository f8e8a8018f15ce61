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


def _fail_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("my bug")
    return dist.get_rank()


def test_launch_checked_returns_the_results_or_names_the_rank_that_failed():
    from course_lib.exercises.common import launch_checked

    with pytest.raises(ExerciseFailed, match="rank 1 failed: ValueError: my bug"):
        launch_checked(_fail_on_rank_one, 2, timeout=60)


def test_judge_cases_details_visible_failures_and_only_counts_hidden_ones():
    from course_lib.exercises.common import HiddenTestFailed, judge_cases

    def wrong_if_odd(item):
        return f"case {item['n']} is wrong" if item["n"] % 2 else None

    judge_cases([{"n": 0, "case": {}}, {"n": 2, "case": {"hidden": True}}], wrong_if_odd)
    with pytest.raises(HiddenTestFailed):
        judge_cases([{"n": 0, "case": {}}, {"n": 1, "case": {"hidden": True}}], wrong_if_odd)
    with pytest.raises(ExerciseFailed, match="case 3 is wrong") as raised:  # visible first
        judge_cases([{"n": 1, "case": {"hidden": True}}, {"n": 3, "case": {}}], wrong_if_odd)
    assert not isinstance(raised.value, HiddenTestFailed)


def test_a_number_is_a_finite_int_or_float_and_not_a_bool():
    from course_lib.exercises.common import is_number

    assert all(is_number(v) for v in (0, 3, -2.5, 1e300, torch.tensor(2.0).item()))
    assert not any(is_number(v) for v in (True, float("nan"), float("inf"), "3", None,
                                          torch.tensor(2.0), [1.0]))


def test_whole_numbers_lists_of_numbers_and_one_number_from_a_tensor():
    from course_lib.exercises.common import are_numbers, as_number, is_whole

    assert all(is_whole(v) for v in (0, 3, -4, 3.0, 1e15))
    # inf and nan are refused, not an OverflowError or ValueError from int()
    assert not any(is_whole(v) for v in (2.5, True, float("inf"), float("nan"), "3", None))
    assert are_numbers([1, 2.5], 2) and are_numbers((0.0,), 1)
    assert not any(are_numbers(v, 2) for v in ([1], [1, 2, 3], [1, float("nan")], [1, True],
                                              "12", torch.tensor([1.0, 2.0])))
    assert as_number(torch.tensor([2.5]), "x") == 2.5 and as_number(3, "x") == 3.0
    for bad in (torch.tensor([1.0, 2.0]), float("inf"), "3", None, True):
        with pytest.raises(ExerciseFailed, match="my answer is .*: return a finite number"):
            as_number(bad, "my answer")
