"""The launch contract, clause by clause (course_lib.runtime.launching)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import workers
from conftest import pids_alive

from course_lib import LaunchTimeout, WorkerError, launch
from course_lib.runtime import devices as D

# Clauses whose code is the same however a worker starts: the launcher refuses the call before
# starting anything, or the worker's own main (the same function, forked or a new interpreter)
# decides the outcome. They run with warm workers only; every clause about starting, streaming,
# stopping or losing processes runs both ways.
WARM_ONLY = {
    "test_launch_with_nccl_on_this_cpu_machine_is_a_clear_value_error",
    "test_world_size_must_be_a_positive_int", "test_unknown_backend_is_rejected",
    "test_fn_must_be_callable", "test_argument_that_cannot_be_sent_is_named",
    "test_malformed_args_kwargs_timeout_are_rejected",
    "test_returns_each_ranks_result_indexed_by_rank", "test_args_and_kwargs_reach_every_rank",
    "test_unpicklable_result_is_a_worker_error", "test_sys_exit_in_fn_is_reported_as_an_error",
    "test_endless_loop_raises_launch_timeout",  # the stuck collective covers cold timeouts
    "test_threads_below_one_or_not_a_whole_number_is_refused",
    "test_a_barrier_only_one_rank_calls_is_a_launch_timeout_not_the_launchers_barrier",
}


@pytest.fixture(autouse=True, params=["warm", "cold"])
def start(request, monkeypatch):
    """A test of the launch contract runs with warm workers (forked by the fork server, on
    Linux) and, unless its clause is in WARM_ONLY, with cold ones (new interpreters)."""
    if request.param == "cold" and request.node.originalname in WARM_ONLY:
        pytest.skip("the same code decides this clause for cold workers (see WARM_ONLY)")
    monkeypatch.setenv("COURSE_LIB_LAUNCH", request.param)
    return request.param


def read_pids(pid_dir):
    return [int(p.read_text()) for p in Path(pid_dir).glob("*.pid")]


# -- results and environment ---------------------------------------------------------------------

def test_returns_each_ranks_result_indexed_by_rank():
    assert launch(workers.rank_and_size, world_size=2) == [(0, 2), (1, 2)]


def test_all_reduce_on_two_ranks_equals_single_process_sum():
    tensors = [torch.randn(5, dtype=torch.float64) for _ in range(2)]
    results = launch(workers.all_reduce_of, world_size=2, args=(tensors,))
    for r in results:
        torch.testing.assert_close(r, tensors[0] + tensors[1])


def test_args_and_kwargs_reach_every_rank():
    results = launch(workers.echo, 2, args=(1, "two"), kwargs={"three": [3]})
    assert results == [(0, (1, "two"), {"three": [3]}), (1, (1, "two"), {"three": [3]})]


def test_environment_is_set_as_torchrun_sets_it():
    envs = launch(workers.environment, world_size=2)
    for rank, env in enumerate(envs):
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1"
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"] != "0"


def test_a_worker_can_fork_data_loader_workers_and_multiprocessing_children():
    # as in one process: the watchdog thread holds no lock a forked child needs
    expected = (list(range(9)), sum(range(9)))
    assert launch(workers.data_loader_and_fork_sums, 2, args=(9,), timeout=90) == [expected] * 2


def test_one_worker_is_a_world_of_one():
    assert launch(workers.rank_and_size, world_size=1) == [(0, 1)]


def test_more_workers_than_cores_warns_and_still_runs():
    n = D.usable_cores() + 1
    with pytest.warns(RuntimeWarning, match="oversubscribed"):
        assert launch(workers.rank_and_size, world_size=n) == [(r, n) for r in range(n)]


# -- spawn, not fork; functions from a notebook cell ----------------------------------------------

def test_workers_never_see_what_the_launcher_imported(tmp_path, monkeypatch):
    (tmp_path / "only_in_parent.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_in_parent  # noqa: F401  (imported here, so a forked child would have it)
    assert launch(workers.has_module, 2, args=("only_in_parent",)) == [False, False]


def test_function_defined_in_main_runs_without_reimporting_main(tmp_path):
    script = tmp_path / "student_script.py"
    script.write_text(textwrap.dedent("""
        import torch.distributed as dist
        from course_lib import launch
        print("top-level code ran")          # spawn-based launchers run this again per worker
        def square_rank():                    # defined in __main__, no __name__ guard
            return dist.get_rank() ** 2
        print(launch(square_rank, world_size=2))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("top-level code ran") == 1
    assert "[0, 1]" in out.stdout


def test_function_defined_in_a_notebook_cell(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import torch, torch.distributed as dist\n"
                                  "from course_lib import launch\n"
                                  "OFFSET = 10\n"
                                  "def cell_fn():\n"
                                  "    t = torch.tensor([dist.get_rank() + OFFSET])\n"
                                  "    dist.all_reduce(t)\n"
                                  "    return t.item()"),
        nbformat.v4.new_code_cell("print('RESULT', launch(cell_fn, world_size=2))"),
    ]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[1].outputs)
    assert "RESULT [21, 21]" in text


# -- backend choice ------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")
def test_launch_with_nccl_on_this_cpu_machine_is_a_clear_value_error():
    with pytest.raises(ValueError, match="nccl"):
        launch(workers.rank_and_size, 2, backend="nccl")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")
def test_workers_use_gloo_on_cpu():
    assert [env["backend"] for env in launch(workers.environment, 2)] == ["gloo", "gloo"]


# -- ports: rerun at once, two at the same time ---------------------------------------------------

def test_same_launch_can_be_rerun_at_once():
    first = launch(workers.environment, 2)
    second = launch(workers.environment, 2)
    assert first[0]["RANK"] == second[0]["RANK"] == "0"


def test_two_launches_at_the_same_time_both_succeed():
    results, errors = {}, []

    def run(name):
        try:
            results[name] = launch(workers.environment, 2)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert results["a"][0]["MASTER_PORT"] != results["b"][0]["MASTER_PORT"]


# -- threads -------------------------------------------------------------------------------------

def test_one_rank_and_two_ranks_compute_with_the_same_threads(monkeypatch):
    # sharing the cores out gave one rank every core's threads: a "speedup" that was threads
    monkeypatch.delenv("COURSE_LIB_THREADS", raising=False)
    envs = launch(workers.environment, 1) + launch(workers.environment, 2)
    assert [env["threads"] for env in envs] == [D.worker_threads()] * 3 == [1] * 3
    assert all(env["OMP_NUM_THREADS"] == str(env["threads"]) for env in envs)
    monkeypatch.setenv("COURSE_LIB_THREADS", "2")  # the kernel's rule, read by the launcher
    assert [env["threads"] for env in launch(workers.environment, 1)] == [2]


def test_threads_gives_every_rank_that_many_and_warns_past_the_cores():
    assert [env["threads"] for env in launch(workers.environment, 1, threads=2)] == [2]
    many = D.usable_cores() + 1
    with pytest.warns(RuntimeWarning, match=f"1 workers x {many} threads on .*oversubscribed"):
        envs = launch(workers.environment, 1, threads=many)
    assert envs[0]["threads"] == many and envs[0]["OMP_NUM_THREADS"] == str(many)


@pytest.mark.parametrize("threads", [0, -1, True, 1.5, "2"])
def test_threads_below_one_or_not_a_whole_number_is_refused(threads):
    with pytest.raises(ValueError, match="threads must be a whole number, at least 1"):
        launch(workers.rank_and_size, 2, threads=threads)


# -- output --------------------------------------------------------------------------------------

def test_worker_output_appears_prefixed_with_its_rank(capsys):
    launch(workers.print_then_sleep, 2, args=(0,))
    out = capsys.readouterr().out
    assert "[rank 0] first line from rank 0" in out
    assert "[rank 1] first line from rank 1" in out


def test_worker_output_appears_while_the_workers_run(monkeypatch):
    arrivals = []

    class Recorder:
        def write(self, text):
            arrivals.append((time.time(), text))

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Recorder())
    finished = launch(workers.print_then_sleep, 2, args=(3.0,))
    first = min(t for t, text in arrivals if "first line" in text)
    # printed 3 s before the workers returned: it must have been shown before they finished
    assert first < min(finished) - 1.0


# -- failures ------------------------------------------------------------------------------------

def test_exception_on_a_rank_raises_worker_error_with_rank_type_message_traceback(tmp_path):
    time_file = tmp_path / "raised_at"
    with pytest.raises(WorkerError) as info:
        launch(workers.raise_on_rank_1, 2, args=(str(tmp_path), str(time_file)), timeout=60)
    caught = time.time()
    err = info.value
    assert err.rank == 1
    assert err.exc_type == "ValueError" and err.exc_message == "boom on purpose"
    assert "raise ValueError" in err.worker_traceback and "raise_on_rank_1" in err.worker_traceback
    assert "rank 1 raised ValueError: boom on purpose" in str(err)
    # the contract's deadline for reporting a failure, not a speed measurement
    assert caught - float(time_file.read_text()) < 5
    assert pids_alive(read_pids(tmp_path)) == []  # rank 0 was stopped, not left in all_reduce


@pytest.mark.parametrize("how, expected", [
    ("os._exit", "rank 1 exited with code 3"),
    ("sigkill", "rank 1 died from signal SIGKILL"),
    ("segfault", "rank 1 died from signal SIGSEGV"),
])
def test_worker_that_dies_names_rank_and_exit_code_or_signal(tmp_path, how, expected):
    with pytest.raises(WorkerError, match=expected) as info:
        launch(workers.exit_on_rank_1, 2, args=(str(tmp_path), how), timeout=60)
    assert info.value.rank == 1
    assert pids_alive(read_pids(tmp_path)) == []


def test_a_rank_that_died_comes_before_a_rank_that_only_lost_its_peer():
    from course_lib.runtime.errors import WorkerError, cause_first, lost_a_peer

    # rank 0's report of the crash is timed before the supervisor saw rank 1 dead
    lost = WorkerError("rank 0 raised RuntimeError", rank=0, exc_type="RuntimeError",
                       exc_message="Gloo connectFullMesh failed with [...] Connection closed by "
                                   "peer [127.0.0.1]:431")
    died = WorkerError("rank 1 died from signal SIGSEGV", rank=1, signal_name="SIGSEGV")
    raised = WorkerError("rank 2 raised ValueError", rank=2, exc_type="ValueError",
                         exc_message="bad shape")
    assert lost_a_peer(lost) and not lost_a_peer(died) and not lost_a_peer(raised)
    assert [e.rank for _, e in cause_first([(1.0, lost), (2.0, died)])] == [1, 0]
    assert [e.rank for _, e in cause_first([(2.0, died), (1.0, raised)])] == [2, 1]


def test_sys_exit_in_fn_is_reported_as_an_error(tmp_path):
    with pytest.raises(WorkerError, match="sys.exit"):
        launch(workers.exit_on_rank_1, 2, args=(str(tmp_path), "sys.exit"), timeout=60)


def test_unpicklable_result_is_a_worker_error():
    with pytest.raises(WorkerError, match="can't be sent back"):
        launch(workers.return_unpicklable, 2)


# Short timeouts keep the suite fast; a cold start (a new interpreter importing torch) needs
# more of them than a warm fork before rank 0 reaches its all-reduce.
TIMEOUT = {"warm": 6, "cold": 10}


def test_rank_stuck_in_a_collective_raises_launch_timeout_naming_ranks(tmp_path, start):
    with pytest.raises(LaunchTimeout) as info:
        launch(workers.stuck_in_collective, 2, args=(str(tmp_path),), timeout=TIMEOUT[start])
    err = info.value
    assert err.ranks == [0, 1]
    assert ("rank 0 still in fn; rank 1 returned from fn and waited for the others (the "
            "launcher's closing wait, not a collective).") in str(err)
    # rank 0's stack runs through the worker function into torch.distributed (on a loaded
    # machine gloo may be inside all_reduce's error path when the stack is taken)
    assert "in stuck_in_collective" in err.stacks[0] and "torch/distributed" in err.stacks[0]
    assert "Where rank 0 was" in str(err)
    assert "finished" not in str(err).split(".")[0]  # nobody had finished: not said
    assert pids_alive(read_pids(tmp_path)) == []


def test_a_barrier_only_one_rank_calls_is_a_launch_timeout_not_the_launchers_barrier(tmp_path):
    # the launcher's closing wait is not a collective: rank 0's barrier finds no partner there
    with pytest.raises(LaunchTimeout) as info:
        launch(workers.stuck_in_collective, 2, args=(str(tmp_path), "barrier"), timeout=6)
    assert info.value.ranks == [0, 1] and "rank 0 still in fn; rank 1 returned" in str(info.value)


def test_endless_loop_raises_launch_timeout(tmp_path, start):
    seconds = TIMEOUT[start]
    with pytest.raises(LaunchTimeout, match=f"after {seconds} s: ranks 0, 1 still in fn"):
        launch(workers.endless_loop, 2, args=(str(tmp_path),), timeout=seconds)
    assert pids_alive(read_pids(tmp_path)) == []


def _run_launcher_script(tmp_path, body):
    script = tmp_path / "launcher.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(workers.__file__).parent)!r})
        import workers
        from course_lib import launch
        {body}
    """))
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_pids(pid_dir, n, proc):
    deadline = time.monotonic() + 60
    try:
        while len(read_pids(pid_dir)) < n:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "workers never started"
            time.sleep(0.1)
    except BaseException:  # the launcher and its workers must not outlive a failed test
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        raise
    return read_pids(pid_dir)


def test_keyboard_interrupt_stops_all_workers_and_reraises(tmp_path):
    proc = _run_launcher_script(tmp_path, f"""
        try:
            launch(workers.endless_loop, 2, args=({str(tmp_path)!r},), timeout=120)
        except KeyboardInterrupt:
            print("KeyboardInterrupt re-raised")
            raise
    """)
    pids = _wait_for_pids(tmp_path, 2, proc)
    proc.send_signal(signal.SIGINT)  # what "interrupt the kernel" does
    out, err = proc.communicate(timeout=30)
    assert "KeyboardInterrupt re-raised" in out
    assert proc.returncode != 0
    assert pids_alive(pids) == []


def test_workers_exit_when_the_launcher_process_is_killed(tmp_path):
    proc = _run_launcher_script(tmp_path, f"""
        launch(workers.endless_loop, 2, args=({str(tmp_path)!r},), timeout=120)
    """)
    pids = _wait_for_pids(tmp_path, 2, proc)
    proc.kill()  # a crashed or restarted kernel: no chance to clean up
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    # workers are in their own session; reap them if they became our zombies' orphans
    assert pids_alive(pids) == []


# -- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [0, -1, 1.5, True, "2", None])
def test_world_size_must_be_a_positive_int(world_size):
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        launch(workers.rank_and_size, world_size)


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="unknown backend 'mpi'"):
        launch(workers.rank_and_size, 2, backend="mpi")


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match="fn must be callable"):
        launch("rank_and_size", 2)


def test_argument_that_cannot_be_sent_is_named():
    with pytest.raises(TypeError, match=r"args\[1\] \(lock\) can't be sent to the workers"):
        launch(workers.echo, 2, args=(1, threading.Lock()))
    with pytest.raises(TypeError, match=r"kwargs\['log'\] \(TextIOWrapper\) can't be sent"):
        with open(os.devnull, "w") as log:
            launch(workers.echo, 2, kwargs={"log": log})


@pytest.mark.parametrize("bad", [dict(args=5), dict(kwargs=[1]), dict(timeout=0),
                                 dict(timeout=-3), dict(timeout=float("nan")),
                                 dict(timeout=float("inf")), dict(timeout=True)])
def test_malformed_args_kwargs_timeout_are_rejected(bad):
    with pytest.raises((TypeError, ValueError), match="args|kwargs|timeout"):
        launch(workers.echo, 2, **bad)
