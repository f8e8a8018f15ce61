"""Lesson 3's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson03). The all-reduce check launches real ranks,
so its wrong answers are judged from data recorded once, without launching again."""

import json

import pytest
import torch
import torch.distributed as dist

from course_lib import collectives as C
from course_lib.exercises import common
from course_lib.exercises import lesson03 as ex


def doubling(tensor):
    """Recursive doubling, as a student would write it."""
    rank, p = dist.get_rank(), dist.get_world_size()
    total, bit = tensor.clone(), 1
    while bit < p:
        incoming = torch.empty_like(total)
        request = dist.isend(total, rank ^ bit)
        dist.recv(incoming, rank ^ bit)
        request.wait()
        total, bit = total + incoming, bit * 2
    return total


def ring(tensor):  # right sum, wrong algorithm: the library's efficient ring
    return C.ring_all_reduce(tensor)[0]


def visible_data(fn):
    return ex.probe_doubling(fn)


@pytest.fixture(scope="module")
def right_data():
    return visible_data(doubling)


def test_doubling_accepts_recursive_doubling_and_names_other_algorithms(right_data):
    assert "correct" in ex.judge_doubling(right_data)
    with pytest.raises(common.ExerciseFailed, match=r"sent 6 message\(s\).*XOR"):
        ex.check_doubling_all_reduce(ring)


def test_doubling_explains_wrong_sums_and_collectives(right_data):
    def altered(change):
        data = common.from_plain(common.to_plain(right_data))
        for rank in data["visible"][0]["ranks"]:
            change(rank[0])
        return data

    def off_by_one(case):
        case["result"] = case["result"] + 1

    data = common.from_plain(common.to_plain(right_data))
    ranks = data["visible"][0]["ranks"]
    for r, rank in enumerate(ranks):  # stop after step 0: each rank holds its pair's sum
        rank[0]["result"] = ranks[r][0]["x"] + ranks[r ^ 1][0]["x"]
    with pytest.raises(common.ExerciseFailed, match="only its pair's sum"):
        ex.judge_doubling(data)
    with pytest.raises(common.ExerciseFailed, match="its own vector"):
        ex.judge_doubling(altered(lambda case: case.update(result=case["x"])))
    with pytest.raises(common.ExerciseFailed, match="no message"):
        ex.judge_doubling(altered(lambda case: case.update(sent=[])))
    with pytest.raises(common.ExerciseFailed, match="returned a tuple"):
        ex.judge_doubling(altered(lambda case: case.update(result="tuple")))
    with pytest.raises(common.ExerciseFailed, match="is off the sum"):
        ex.judge_doubling(altered(off_by_one))


def test_doubling_reports_a_rank_that_raises():
    def not_written(tensor):
        raise NotImplementedError("write your solution here")

    def broken(tensor):
        raise ValueError("oops")

    with pytest.raises(common.NotSolved, match="still raises NotImplementedError"):
        ex.check_doubling_all_reduce(not_written)
    with pytest.raises(common.ExerciseFailed, match="on 4 ranks.*ValueError"):
        ex.check_doubling_all_reduce(broken)


def test_hidden_cases_are_judged_only_in_a_graded_run(monkeypatch, tmp_path, right_data):
    assert ex.runs_for(None).keys() == {"visible"}
    assert {p for p, _ in ex.runs_for(12345)["hidden"]} == {8, 4}  # the grader also tries 8 ranks
    hidden = common.from_plain(common.to_plain(right_data))
    hidden["hidden"] = [{"p": 8, "failed": True}]  # e.g. a solution that works only for p <= 4
    with pytest.raises(common.HiddenTestFailed):
        ex.judge_doubling(hidden)
    hidden["hidden"].append({"p": 4, "failed": False, "ranks": right_data["visible"][0]["ranks"]})
    with monkeypatch.context() as graded:  # the judge's own hidden runs: 8 ranks failed
        graded.setenv(common.HIDDEN_SEED, "12345")
        with pytest.raises(common.HiddenTestFailed):
            ex.judge_doubling(hidden)

    def right_on_visible_only(tensor):  # wrong for a length the visible cases do not have
        return doubling(tensor) + (tensor.numel() == 3)

    # two ranks only, to keep the test short: the plan's shape is what matters
    monkeypatch.setattr(ex, "runs_for", lambda seed: {"visible": [(2, [5])]} | (
        {} if seed is None else {"hidden": [(2, [3])]}))
    assert "correct" in ex.check_doubling_all_reduce(right_on_visible_only)
    # in the grader's kernel the data (hidden cases too) goes to a file; the grader judges it
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    assert "recorded" in ex.check_doubling_all_reduce(right_on_visible_only)
    written = list(tmp_path.iterdir())
    assert [p.name for p in written] == ["000-lesson03.doubling_all_reduce.json"]
    data = common.from_plain(json.loads(written[0].read_text()))
    assert [run["p"] for run in data["hidden"]] == [2]
    with pytest.raises(common.HiddenTestFailed):
        common.JUDGES["lesson03.doubling_all_reduce"](data)


ALPHA, BETA = 0.215e-3, 1 / 0.55e9  # a run's per-message constants (any positive pair works)


def crossing(p):
    """The student's way: 2 (p - 1) a + 2 (p - 1) / p n b = log2(p) (a + n b), solved for n."""
    steps = p.bit_length() - 1
    return (2 * (p - 1) - steps) * ALPHA / ((steps - 2 * (p - 1) / p) * BETA)


def test_crossover_accepts_the_size_within_the_tolerance_and_explains_wrong_ones():
    assert "correct" in ex.check_crossover_size(crossing(8), ALPHA, BETA, 8)
    assert "correct" in ex.check_crossover_size(crossing(8) * 1.009, ALPHA, BETA, 8)
    assert "correct" in ex.check_crossover_size(crossing(16), ALPHA, BETA, 16)
    with pytest.raises(common.ExerciseFailed, match="in kB: give it in bytes"):
        ex.check_crossover_size(crossing(8) / 1e3, ALPHA, BETA, 8)
    with pytest.raises(common.ExerciseFailed, match="the ring is faster, so the crossing is at "
                                                    "smaller"):
        ex.check_crossover_size(crossing(8) * 1.02, ALPHA, BETA, 8)
    with pytest.raises(common.ExerciseFailed, match="recursive doubling is faster"):
        ex.check_crossover_size(8 * ALPHA / BETA, ALPHA, BETA, 8)  # one message per step only
    with pytest.raises(common.ExerciseFailed, match="recursive doubling is faster"):
        ex.check_crossover_size(ALPHA / BETA, ALPHA, BETA, 8)  # n_1/2 of one message
    with pytest.raises(common.ExerciseFailed, match="power of two"):
        ex.check_crossover_size(crossing(8), ALPHA, BETA, 6)
    with pytest.raises(common.ExerciseFailed, match="alpha_msg"):
        ex.check_crossover_size(crossing(8), 0.0, BETA, 8)
    with pytest.raises(common.ExerciseFailed, match="number of bytes"):
        ex.check_crossover_size(float("nan"), ALPHA, BETA, 8)


def test_a_graded_run_draws_a_p_no_digest_holds_and_the_judge_sees_it_unchanged(monkeypatch):
    from course_lib.exercises.lesson03 import draw_ranks

    assert common.drawn("lesson03.ranks", draw_ranks) == 8  # the student edition's: digested
    monkeypatch.setenv(common.GRADING_SEED, "12345")
    p = common.drawn("lesson03.ranks", draw_ranks)
    assert 128 <= p <= 2**20 and p & (p - 1) == 0
    assert "correct" in ex.check_crossover_size(crossing(p), ALPHA, BETA, p)
    with pytest.raises(ex.ExerciseFailed, match=f"RANKS is 8, but this run drew {p}"):
        ex.check_crossover_size(crossing(8), ALPHA, BETA, 8)  # 8's answer, found in the digests
