"""Practice draws: the student edition judges answers that depend on a run's drawn values by the
digests of each practice draw's answers (course_lib.exercises.practice)."""

import json
import math

import pytest

from course_lib.exercises import (  # noqa: F401  (each lesson module registers its own)
    common,
    lesson01,
    lesson02,
    lesson03,
    lesson06,
    lesson06b,
    lesson07b,
    lesson08,
    lesson09,
    lesson12,
    lesson12b,
    practice,
)

NAMES = ["lesson01.cost_sizes", "lesson02.q_after", "lesson03.crossover_size",
         "lesson06.gradients_per_second", "lesson06b.gossip_steps", "lesson07b.message_bytes",
         "lesson08.partition",
         "lesson09.federation", "lesson12.split_stages", "lesson12b.pairs_in_order"]


def graded_and_practice_draws(monkeypatch, name, draw, runs=200) -> set:
    """The draws of ``runs`` graded runs (seeds 0, 1, ...), after checking that runs outside the
    grader draw practice draws only."""
    monkeypatch.delenv(common.GRADING_SEED, raising=False)
    practised = {common.drawn(name, draw) for _ in range(100)}
    assert practised <= {tuple(d) for d in practice.draws(name, draw)}
    graded = set()
    for seed in range(runs):
        monkeypatch.setenv(common.GRADING_SEED, str(seed))
        graded.add(common.drawn(name, draw))
    monkeypatch.delenv(common.GRADING_SEED)
    return graded


@pytest.fixture(scope="module")
def table():
    return practice.table()


def test_the_shipped_table_is_the_instructors_library_s(table):
    """practice.json holds what the instructor's library computes now (run
    ``python -c "from course_lib.exercises import practice; practice.write()"`` after an
    exercise changes)."""
    assert sorted(practice.EXERCISES) == NAMES
    assert json.loads(practice.TABLE.read_text()) == table


def test_the_table_holds_digests_not_answers(table):
    """Every entry is a 20-digit hex digest of an accepted answer, salted by its case and part
    (the answer itself is in no entry)."""
    for name in NAMES:
        cases, answers = practice.EXERCISES[name]
        for case in cases()[:4]:
            for part, digests in table[name][practice.key(case)].items():
                accepted = answers(case)[part]
                assert all(len(d) == 20 and int(d, 16) >= 0 for d in digests)
                assert digests == sorted(practice.salted(name, case, part, v) for v in accepted)
                assert not {json.dumps(v) for v in accepted} & set(digests)


@pytest.mark.parametrize("name", NAMES)
def test_the_practice_judge_tells_right_from_wrong_on_every_practice_case(name):
    cases, answers = practice.EXERCISES[name]
    for case in cases():
        right = {part: accepted[len(accepted) // 2] for part, accepted in answers(case).items()}
        assert practice.judge(name, case, right).startswith("correct for this run's values")
        for part in right:
            # one past every accepted whole number (an answer of None: 1 step)
            off = max((v for v in answers(case)[part] if v is not None), default=0) + 1
            with pytest.raises(common.ExerciseFailed, match=part):
                practice.judge(name, case, {**right, part: off}, {part: "mine"})


def test_a_case_that_is_not_a_practice_case_is_left_to_the_grader():
    verdict = practice.judge("lesson01.cost_sizes", [3, 9, 10, [1, 8, 8]], {"forward": 1})
    assert verdict.startswith("recorded: the grader judges it")
    assert practice.judge("lesson99.none", [1], {"x": 1}).startswith("recorded")


def test_outside_the_grader_a_practised_draw_is_a_practice_draw(monkeypatch):
    monkeypatch.delenv(common.GRADING_SEED, raising=False)
    draws = practice.draws("lesson09.federation", lesson09.draw_federation)
    assert len(draws) == common.PRACTICE_DRAWS and len({json.dumps(d) for d in draws}) > 8
    seen = {json.dumps(common.to_plain(common.drawn("lesson09.federation",
                                                    lesson09.draw_federation)))
            for _ in range(200)}
    assert seen <= {json.dumps(d) for d in draws} and len(seen) > 8
    monkeypatch.setenv(common.GRADING_SEED, "12345")  # the grader: its own draw, every time alike
    graded = common.drawn("lesson09.federation", lesson09.draw_federation)
    assert graded == common.drawn("lesson09.federation", lesson09.draw_federation)
    assert common.to_plain(graded) not in draws


def test_an_unmarked_draw_stays_fresh_outside_the_grader(monkeypatch):
    monkeypatch.delenv(common.GRADING_SEED, raising=False)
    seen = {common.drawn("x.fresh", lambda rng: int(rng.integers(10**9))) for _ in range(50)}
    assert len(seen) == 50


def test_practice_rng_is_the_same_for_a_name_and_index():
    a = common.practice_rng("lesson01.cost_sizes", 3).integers(10**9)
    assert a == common.practice_rng("lesson01.cost_sizes", 3).integers(10**9)
    assert a != common.practice_rng("lesson01.cost_sizes", 4).integers(10**9)


@pytest.mark.parametrize("right", [0.1234567, 0.0, 3.0, 0.00049])
def test_a_value_is_accepted_within_its_tolerance_and_never_beyond(right):
    tol = 1e-3
    accepted = set(practice.near(right, tol))
    for off in (0.0, 1e-9, -1e-9, 0.45 * tol, -0.45 * tol):
        assert practice.bin_of(right + off, tol) in accepted
    for off in (tol * 1.0001, -tol * 1.0001, 0.01, -0.5):
        assert practice.bin_of(right + off, tol) not in accepted


def test_the_crossing_is_judged_by_its_ratio_to_alpha_over_beta():
    """Lesson 3's answer is alpha / beta times a number of p: one digest per p serves every run's
    fit; within 1% is right, 2% off is wrong."""
    alpha, beta = 0.215e-3, 1 / 0.55e9
    right = lesson03.crossing(8, alpha, beta)
    assert math.isclose(right / (alpha / beta), lesson03.crossing(8, 1.0, 1.0), rel_tol=1e-12)
    for factor, ok in ((1.0, True), (1.004, True), (0.996, True), (1.02, False), (0.98, False)):
        bin_ = practice.bin_of(math.log(right * factor * beta / alpha), math.log(1.01))
        try:
            practice.judge("lesson03.crossover_size", [8], {"n_cross": bin_})
            assert ok, factor
        except common.ExerciseFailed:
            assert not ok, factor


def test_a_mark_makes_a_draw_practised():
    def draw(rng):
        return int(rng.integers(5))

    assert practice.practised(draw) is draw and draw.practice is True


@pytest.mark.parametrize("name, module, draw", [
    ("lesson01.cost_sizes", "lesson01", "draw_cost_sizes"),
    ("lesson02.q_after", "lesson02", "draw_q_after"),
    ("lesson09.federation", "lesson09", "draw_federation")])
def test_a_graded_run_never_draws_a_practice_draw_whose_answers_are_digested(monkeypatch, name,
                                                                             module, draw):
    import importlib

    draw = getattr(importlib.import_module(f"course_lib.exercises.{module}"), draw)
    shipped = {json.dumps(d) for d in practice.draws(name, draw)}
    graded = []
    for seed in range(60):
        monkeypatch.setenv(common.GRADING_SEED, str(seed))
        graded.append(json.dumps(common.to_plain(common.drawn(name, draw))))
        assert graded[-1] == json.dumps(common.to_plain(common.drawn(name, draw)))  # the judge's
    assert not shipped & set(graded) and len(set(graded)) > 20
