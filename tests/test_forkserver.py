"""Warm launches (course_lib.runtime.forkserver): fresh workers forked by a server that has only
imported torch, and a server that never outlives its launcher.

The launch contract itself (results, errors, timeouts, Ctrl-C, no orphans) is tested for warm
and cold workers alike in test_launch.py; this file tests what is particular to the server.
"""

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import workers
from conftest import is_fork_server, pids_alive

from course_lib import launch
from course_lib.runtime import forkserver

pytestmark = pytest.mark.skipif(not forkserver.supported(), reason="warm launches need Linux")


def worker_facts(module_name):
    import numpy as np
    import torch.distributed as dist

    parent = psutil.Process(os.getppid())
    return dict(rank=dist.get_rank(), pid=os.getpid(), parent=" ".join(parent.cmdline()),
                has_module=module_name in sys.modules, numpy_draw=float(np.random.rand()),
                session_leader=os.getsid(0) == os.getpid())


def import_module(name):
    __import__(name)
    return name in sys.modules


def own_command_line():
    return open("/proc/self/cmdline").read()


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_ps_shows_each_worker_as_its_rank_and_function(warm):
    pytest.importorskip("setproctitle")  # without it the command lines stay as they were
    lines = launch(own_command_line, 2, warm=warm)
    for rank, line in enumerate(lines):
        assert line.startswith(f"course_lib worker: rank {rank} of 2, own_command_line"), line
    if warm:  # and the server says whose it is
        server = psutil.Process(forkserver.running().process.pid)
        assert " ".join(server.cmdline()).startswith(
            f"{forkserver.TITLE} (for pid {os.getpid()})")


def test_without_setproctitle_the_command_line_is_left_alone(monkeypatch):
    from course_lib.runtime import worker

    monkeypatch.setitem(sys.modules, "setproctitle", None)  # as if it were not installed
    before = own_command_line()
    worker.set_title("course_lib worker: not shown")
    assert own_command_line() == before


def test_warm_workers_are_forked_by_the_server_and_cold_ones_are_not():
    warm = launch(worker_facts, 2, args=("json",))
    cold = launch(worker_facts, 2, args=("json",), warm=False)
    assert all(is_fork_server(f["parent"]) for f in warm)
    assert not any(is_fork_server(f["parent"]) for f in cold)
    assert all(f["session_leader"] for f in warm + cold)  # stopping a worker stops its children


def test_every_launch_gets_new_workers_that_ran_nothing_before(tmp_path, monkeypatch):
    (tmp_path / "imported_by_a_job.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = launch(import_module, 2, args=("imported_by_a_job",))
    assert first == [True, True]
    again = launch(worker_facts, 2, args=("imported_by_a_job",))
    assert [f["has_module"] for f in again] == [False, False]  # the first job's import is gone


def test_workers_draw_different_random_numbers_like_new_processes():
    draws = [f["numpy_draw"] for f in launch(worker_facts, 2, args=("json",))]
    draws += [f["numpy_draw"] for f in launch(worker_facts, 2, args=("json",))]
    assert len(set(draws)) == 4  # numpy's global state is reseeded in every child


def test_a_changed_course_lib_gets_a_new_server(monkeypatch):
    launch(workers.rank_and_size, 2)
    old = forkserver.running()
    real = forkserver.signature
    monkeypatch.setattr(forkserver, "signature", lambda: ("edited",) + real())
    launch(workers.rank_and_size, 2)
    assert forkserver.running() is not old and old.process.poll() is not None  # replaced, gone


def test_launch_starts_cold_when_the_server_cannot_start(monkeypatch):
    forkserver.shutdown()

    def broken(env):
        raise RuntimeError("no fork server today")

    monkeypatch.setattr(forkserver, "ForkServer", broken)
    facts = launch(worker_facts, 2, args=("json",))
    assert not any(is_fork_server(f["parent"]) for f in facts)


def test_server_dies_with_a_killed_launcher_and_after_its_idle_time(tmp_path):
    script = tmp_path / "launcher.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from course_lib import launch
        from course_lib.runtime import forkserver
        launch(lambda: 0, 2)
        print(forkserver.running().process.pid, flush=True)
        time.sleep(float(sys.argv[1]))
    """))
    env = dict(os.environ, COURSE_LIB_LAUNCH="warm", COURSE_LIB_FORKSERVER_IDLE_S="2")
    # killed: a crashed or restarted kernel, with no chance to clean up
    killed = subprocess.Popen([sys.executable, str(script), "120"], stdout=subprocess.PIPE,
                              text=True, env=env)
    server_pid = int(killed.stdout.readline())
    assert pids_alive([server_pid]) == [server_pid]
    killed.kill()
    killed.communicate(timeout=30)
    _assert_gone(server_pid)
    # idle: a notebook that never launches again, still open
    idle = subprocess.Popen([sys.executable, str(script), "120"], stdout=subprocess.PIPE,
                            text=True, env=env)
    server_pid = int(idle.stdout.readline())
    _assert_gone(server_pid)
    assert idle.poll() is None  # its launcher is still there
    idle.kill()
    idle.communicate(timeout=30)


def test_server_is_gone_after_a_kernel_restart():
    manager = pytest.importorskip("jupyter_client.manager")
    km, kc = manager.start_new_kernel(kernel_name="python3")
    try:
        printed = []
        kc.execute_interactive(
            "from course_lib import launch\nfrom course_lib.runtime import forkserver\n"
            "launch(lambda: 0, 2)\nprint(forkserver.running().process.pid)", timeout=120,
            output_hook=lambda msg: printed.append(msg["content"].get("text", "")))
        server_pid = int("".join(printed).split()[-1])
        assert pids_alive([server_pid]) == [server_pid]
        km.restart_kernel(now=True)
        _assert_gone(server_pid)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _assert_gone(pid, within=15):
    deadline = time.monotonic() + within
    while pids_alive([pid]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids_alive([pid]) == []


def test_running_names_the_server_until_it_is_shut_down(monkeypatch):
    monkeypatch.setenv("COURSE_LIB_LAUNCH", "warm")
    launch(workers.rank_and_size, 2)
    server = forkserver.running()
    assert server is not None and server.process.poll() is None
    forkserver.shutdown()
    assert forkserver.running() is None and server.process.poll() is not None
