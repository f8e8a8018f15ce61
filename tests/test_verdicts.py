"""A check in a student's kernel shows one box and never raises; elsewhere it raises."""

import json

import pytest

from course_lib.exercises import common, judging, verdicts


def _probe(fn):
    return {"got": fn(3)}


def _judge(data):
    if data["got"] != 9:
        raise common.ExerciseFailed(f"square(3) gave {data['got']}, not 9")
    return "correct: square(3) is 9"


check_square = common.checked("test.square", _probe, _judge)


def not_written(x):
    raise NotImplementedError("write your solution here")


def test_outside_a_kernel_a_check_returns_or_raises(monkeypatch):
    monkeypatch.delenv(verdicts.MODE, raising=False)
    assert not verdicts.showing()  # pytest is no Jupyter kernel
    assert check_square(lambda x: x * x) == "correct: square(3) is 9"
    with pytest.raises(common.ExerciseFailed, match="gave 6"):
        check_square(lambda x: 2 * x)
    with pytest.raises(common.NotSolved, match="still raises NotImplementedError"):
        check_square(not_written)
    with pytest.raises(common.NotSolved, match="still `...`"):
        check_square(...)


def test_in_a_kernel_a_check_shows_one_box_and_goes_on(monkeypatch, capsys):
    monkeypatch.setenv(verdicts.MODE, "show")
    assert check_square(not_written) is None
    assert capsys.readouterr().out.startswith("not solved yet: your code still raises")
    assert check_square(...) is None
    assert capsys.readouterr().out.startswith("not solved yet: the answer is still `...`")
    assert check_square(lambda x: 2 * x) is None
    out = capsys.readouterr().out
    assert out.startswith("wrong: square(3) gave 6, not 9") and "last_traceback()" in out
    assert check_square(lambda x: x * x) is None
    assert capsys.readouterr().out.strip() == "correct: square(3) is 9"
    check_square(lambda x: 1 / 0)  # the student's code crashed: said first, traceback kept
    assert capsys.readouterr().out.startswith("wrong: your code raised ZeroDivisionError")
    assert "ZeroDivisionError" in verdicts.last_traceback()


def test_the_box_puts_the_explanation_first_and_folds_the_traceback():
    bundle = verdicts.box("wrong", "x < y", "Traceback ...<b>")
    assert bundle["text/plain"].splitlines()[0] == "wrong: x < y"
    assert "x &lt; y" in bundle["text/html"] and "&lt;b&gt;" in bundle["text/html"]
    assert bundle["text/html"].index("x &lt; y") < bundle["text/html"].index("<details>")
    assert "<details>" not in verdicts.box("correct", "correct: fine")["text/html"]
    assert verdicts.box("correct", "correct: fine")["text/plain"] == "correct: fine"
    with pytest.raises(ValueError, match="kind must be one of"):
        verdicts.box("maybe", "?")


def test_under_the_grader_an_unanswered_check_records_why_and_the_judge_scores_it_0(
        monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(verdicts.MODE, "show")
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))
    for answer, said in ((not_written, "not solved yet: your code still raises"),
                         (lambda x: 1 / 0, "your code raised ZeroDivisionError"),
                         (lambda x: 2 * x, "ExerciseFailed: square(3) gave 6"),
                         (lambda x: x * x, "correct")):
        for old in tmp_path.glob("*"):
            old.unlink()
        check_square(answer)
        assert len(list(tmp_path.glob("*.json"))) == 1  # one record, whatever happened
        assert judging.judge_data(_records(tmp_path), ["test.square"]).startswith(said)
    capsys.readouterr()
    assert judging.judge_data([{"name": "test.square", "data": {"got": 9}}],
                              ["test.square"]) == "correct"
    # every record of the check is judged: a second one, wrong, costs the exercise
    assert judging.judge_data([{"name": "test.square", "data": {"got": 9}},
                               {"name": "test.square", "data": {"got": 8}}],
                              ["test.square"]).startswith("ExerciseFailed")
    assert judging.judge_data([{"name": "other", "data": {"got": 9}}, "junk"], ["test.square"]) \
        == "the check cell recorded no answer for test.square"


def _records(folder):
    """The records a check wrote as files, as the grader takes them out of the messages."""
    return [{"name": p.stem.split("-", 1)[1], "data": json.loads(p.read_text())}
            for p in sorted(folder.glob("*.json"))]


def test_what_counts_as_not_solved():
    assert common.not_solved(NotImplementedError("anything"))
    assert common.not_solved(common.ExerciseFailed("rank 1 failed: write your solution here"))
    try:
        try:
            raise NotImplementedError("write your solution here")
        except NotImplementedError:
            raise common.ExerciseFailed("on 2 ranks: it failed")  # noqa: B904 - the chain
    except common.ExerciseFailed as error:
        assert common.not_solved(error)
    assert not common.not_solved(ValueError("no"))
    # the student edition's library leaving a reference out is not the student's stub
    assert not common.not_solved(NotImplementedError("not in the student edition: the grader"))
