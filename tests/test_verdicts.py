"""A check in a student's kernel shows one box and never raises; elsewhere it raises."""

import json
import re

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


def test_a_judge_that_runs_past_its_limit_is_stopped_and_not_judged(monkeypatch):
    def endless(data):
        try:
            while True:
                pass
        except Exception:  # noqa: BLE001 - a judge's own broad except does not end the limit
            return "correct"

    monkeypatch.setitem(common.JUDGES, "test.endless", endless)
    monkeypatch.setattr(judging, "JUDGE_SECONDS", 0.2)
    verdict = judging.judge_data([{"name": "test.endless", "data": {}}], ["test.endless"])
    assert verdict.startswith("the check's data took more than 0.2 s to judge")
    import signal

    assert judging.judge_data([], []) == "correct"  # ended in time: its verdict, no timer left
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    signal.setitimer(signal.ITIMER_REAL, 50)  # a timer that ran before is put back
    try:
        with judging.time_limit(5):
            pass
        assert 45 < signal.getitimer(signal.ITIMER_REAL)[0] <= 50
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


@pytest.mark.parametrize("name, data, match", [
    ("lesson04.epochs_worth", {"run": {"base": [1.0] * 2000, "scaled": [0.5], "answers": [None]}},
     "lists of at most 1000 epochs"),
    ("lesson01.backward_cost", {"batch": 8, "image": [1, 800, 800], "layers": [], "forward": 1,
                                "backward": 2}, r"image shape, split.x_train.shape\[1:\]"),
    ("lesson09.breakdown", {"breakdown": {}, "rounds": 10**7, "seeds": [0], "m": 10, "trim": 0.1,
                            "share": 0.2, "attack_seed": 0}, "ROUNDS and SEEDS")])
def test_judges_refuse_run_data_far_larger_than_the_lessons(name, data, match, monkeypatch):
    import importlib

    importlib.import_module(f"course_lib.exercises.{name.split('.')[0]}")
    monkeypatch.setattr(judging, "JUDGE_SECONDS", 30)
    verdict = judging.judge_data([{"name": name, "data": data}], [name])
    assert verdict.startswith("ExerciseFailed") and re.search(match, verdict), verdict


def test_summary_keeps_each_exercise_on_one_line_whatever_its_feedback_holds():
    from course_lib.exercises import grading

    report = dict(submission="s.ipynb", score=0, points=1, seconds=1.0, exercises=[
        dict(grade_id="exercise-1", score=0, points=1, feedback="wrong\nexercise-2  1/1  correct")],
        ungraded_errors=[dict(cell=3, error="a\nb")])
    lines = grading.summary(report).splitlines()
    assert len(lines) == 3 and lines[1].endswith("wrong exercise-2  1/1  correct")
    assert lines[2] == "  (cell 3, not graded, failed: a b)"


def _nest(folder, depth):
    """``depth`` folders, each inside the last, under ``folder``: by file descriptor, as a kernel
    can (a path that deep is longer than the system takes)."""
    import os

    fd = os.open(folder, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)


def test_a_folder_tree_deeper_than_pythons_recursion_limit_is_removed(tmp_path):
    from course_lib.exercises import guard

    (tmp_path / "tree").mkdir()
    _nest(tmp_path / "tree", 1200)  # deeper than sys.getrecursionlimit(): rmtree of 3.11 fails
    guard.remove_tree(tmp_path / "tree")
    assert not (tmp_path / "tree").exists()
    sockets = tmp_path / "sockets"  # a kernel's sockets' folder, cleaned after a restart
    sockets.mkdir()
    (sockets / "kernel.json").write_text("{}")
    _nest(sockets, 1200)
    guard.clean_sockets_folder(sockets)
    assert [p.name for p in sockets.iterdir()] == ["kernel.json"]


def test_replay_stops_at_the_notebooks_deadline_and_at_a_copy_past_its_limit():
    import time

    from nbformat.v4 import new_code_cell, new_notebook

    from course_lib.exercises import kernels

    class Timeout(Exception):
        ename = "CellTimeout"

    class Client:
        timeout, check_data, ran = 1, {}, []

        def execute_cell(self, cell, index, store_history):
            self.ran.append(index)
            if cell.source == "slow":
                raise Timeout

    class Guard:
        deadline = None

    nb = new_notebook(cells=[new_code_cell(s) for s in ("a = 1", "slow", "b = 2")])
    client, guard = Client(), Guard()
    stopped = kernels.replay(client, nb, [0, 1, 2], time.monotonic() + 60, guard)
    assert client.ran == [0, 1] and guard.deadline is None  # nothing replayed after the slow one
    assert stopped == "cell 1 did not run again (Timeout)"
    client.ran = []
    stopped = kernels.replay(client, nb, [0, 2], time.monotonic() - 1, guard)
    assert client.ran == [] and stopped == "the notebook's limit came at cell 0"
    assert kernels.replay(client, nb, [0, 2]) is None and client.ran == [0, 2]
