import os
import time

import psutil
import pytest

os.environ.setdefault("MPLBACKEND", "Agg")  # figures in tests never need a display


def is_fork_server(command: str) -> bool:
    """The fork server's command line: its process title (course_lib.runtime.forkserver.TITLE),
    or ``python -m course_lib.runtime.forkserver FD`` where setproctitle is not installed."""
    return "course_lib fork server" in command or "course_lib.runtime.forkserver" in command


def _live_children():
    # multiprocessing's resource tracker (started once by mp.spawn in the benchmark) lives as
    # long as the test process by design: it is not a worker
    live = []
    for p in psutil.Process().children(recursive=True):
        try:
            command = " ".join(p.cmdline())
            # the fork server of warm launches lives as long as this process (or its idle
            # timeout) by design; the workers it forks are its children and are checked
            if (p.status() != psutil.STATUS_ZOMBIE
                    and "multiprocessing.resource_tracker" not in command
                    and not (is_fork_server(command) and p.ppid() == os.getpid())):
                live.append(p)
        except psutil.NoSuchProcess:
            pass
    return live


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every test must leave no worker process behind, whatever it did."""
    yield
    deadline = time.monotonic() + 5  # a test's own short-lived helpers may still be exiting
    while _live_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _live_children()
    assert not left, f"processes left behind: {[(p.pid, p.cmdline()) for p in left]}"


def pids_alive(pids):
    """The pids (of workers that reported them) that are still running and not zombies."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


# -- time per notebook -----------------------------------------------------------------------------
# tests/test_lessons.py grades each lesson (the instructor's notebook, only what its exercises
# need; the student edition, every cell) and records the seconds the grader took to run it; CI's
# log gets them at the end. With -n 2, the reports of both workers reach this hook in the main
# process.
_notebook_seconds = {}


def pytest_runtest_logreport(report):
    for name, value in report.user_properties:
        if name == "notebook_seconds" and report.when == "call":
            _notebook_seconds[report.nodeid] = value


def pytest_terminal_summary(terminalreporter):
    if _notebook_seconds:
        terminalreporter.section("seconds per notebook, as graded in the sandbox")
        for nodeid, seconds in sorted(_notebook_seconds.items()):
            lesson = nodeid.split("::")[1].removeprefix("TestLesson")
            edition = ("instructor, what the exercises need" if "instructors" in nodeid
                       else "student edition, every cell")
            terminalreporter.line(f"{seconds:7.1f} s  lesson {lesson}, {edition}")

