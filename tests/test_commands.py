"""Every lesson's command line (course_lib.commands, and each concept module's ``main``).

Each command runs twice, at the same time: through launch (``python -m course_lib.X
--world-size 2``) and under ``torchrun --standalone --nproc-per-node 2 -m course_lib.X``; both
must print the same result. "The same": the same words, the same integers, and floats equal to
rounding. Lines with the word "measured" hold times (or what depends on them: the order in which
asynchronous messages arrive) and are left out; nothing here asserts a timing.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import uuid

import pytest
import torch

from course_lib import commands
from course_lib.runtime.devices import loopback_interface

# every lesson's command, with options that keep it to a second or two on two cores
COMMANDS = {
    "course_lib.parameter_server": [],
    "course_lib.collectives": [],
    "course_lib.data_parallel": [],
    "course_lib.pipeline": ["--forward-ms", "5", "--backward-ms", "10"],
    "course_lib.tensor_parallel": [],
    "course_lib.async_sgd": ["--gradients", "30", "--slowdown", "1", "--compute-ms", "1"],
    "course_lib.quantization": [],
    "course_lib.federated": ["--rounds", "3"],
    "course_lib.zero": ["--steps", "5"],
}
ENV = dict(os.environ, PYTHONUNBUFFERED="1")
TIMEOUT_S = 120
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?")
launched = {}  # module -> what its launch run printed, for the test across two nodes


def start(cmd, env=ENV):
    """A command in its own process group, so that a hang can be ended with all its children."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)


def finish(procs, timeout=TIMEOUT_S) -> list[str]:
    """Wait for every process; on a hang or a failure kill them all and fail with their stderr."""
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{err[-3000:]}"
            outputs.append(out)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{[p.args for p in procs]} still running after {timeout} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return outputs


def result(stdout: str) -> list[str]:
    """The lines a command printed as its result (not the ranks' own lines, nor measured ones);
    there must be some."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()
             and not line.startswith("[rank") and "measured" not in line]
    assert lines and any(NUMBER.search(line) for line in lines), f"no result in:\n{stdout}"
    return lines


def assert_same_result(a: list[str], b: list[str]) -> None:
    """The same words; integers equal; floats equal to rounding."""
    assert [NUMBER.sub("#", line) for line in a] == [NUMBER.sub("#", line) for line in b]
    numbers = [[NUMBER.findall(line) for line in lines] for lines in (a, b)]
    for x, y in zip(sum(numbers[0], []), sum(numbers[1], []), strict=True):
        if re.search(r"[.e]", x + y):
            torch.testing.assert_close(float(x), float(y), rtol=1e-6, atol=1e-9)
        else:
            assert x == y


def launch_form(module):
    return [sys.executable, "-m", module, "--world-size", "2", *COMMANDS[module]]


@pytest.mark.parametrize("module", COMMANDS)
def test_command_prints_the_same_through_launch_and_under_torchrun(module):
    torchrun = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", module,
                *COMMANDS[module]]
    through_launch, under_torchrun = finish([start(launch_form(module)), start(torchrun)])
    launched[module] = result(through_launch)
    assert_same_result(launched[module], result(under_torchrun))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_command_runs_across_two_torchrun_nodes_on_loopback():
    module = "course_lib.collectives"
    env = dict(ENV, GLOO_SOCKET_IFNAME=loopback_interface() or "lo")  # both "nodes" are here
    endpoint, job = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    nodes = [start([*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(i),
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job,
                    "--local-addr", "127.0.0.1", "-m", module, *COMMANDS[module]], env=env)
             for i in range(2)]
    printed = "".join(finish(nodes))  # the node with global rank 0 prints the result
    if module not in launched:  # run alone (pytest -k): the launch form for comparison
        launched[module] = result(finish([start(launch_form(module))])[0])
    assert_same_result(launched[module], result(printed))


@pytest.mark.parametrize("module, argv, said", [
    ("parameter_server", ["--iterations", "-5"], "argument --iterations: must be at least 1"),
    ("federated", ["--fraction", "1.5"], "argument --fraction: must be above 0 and at most 1"),
    ("async_sgd", ["--slowdown", "0.5"], "argument --slowdown: must be at least 1, got 0.5"),
    ("pipeline", ["--forward-ms", "inf"], "argument --forward-ms: must be at least 0"),
    ("collectives", ["--numel", "2.5"], "argument --numel: '2.5' is not a whole number"),
    ("data_parallel", ["--samples", "10"], ": 10 rows over 2 ranks give each 5"),  # a rank's
    ("parameter_server", ["--world-size", "1"], "a server and at least one worker")])
def test_a_lessons_options_are_checked_and_refused_as_usage_errors(module, argv, said, capsys):
    import importlib
    with pytest.raises(SystemExit) as stopped:
        importlib.import_module(f"course_lib.{module}").main(argv)
    assert stopped.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("module", ["course_lib.cost_models", "course_lib.plots"])
def test_a_module_without_a_command_says_so_and_exits_2(module):
    done = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True,
                          env=ENV, timeout=60)
    assert done.returncode == 2
    assert f"{module} has no command" in done.stderr
    for listed in ("course_lib.data_parallel", "course_lib.hello", "course_lib.train_gpt"):
        assert f"python -m {listed}\n" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("module", ["course_lib.hello", "course_lib.exercises"])
def test_a_module_with_a_command_still_starts(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                          text=True, env=ENV, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage:" in done.stdout and "has no command" not in done.stderr


def test_the_list_of_commands_prints_without_a_warning():
    done = subprocess.run([sys.executable, "-m", "course_lib.commands"], capture_output=True,
                          text=True, env=ENV, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "  course_lib.train_gpt\n" in done.stdout and "  course_lib.hello\n" in done.stdout


def test_every_lesson_command_is_listed():
    listed = commands.modules_with_a_command()
    assert set(COMMANDS) | {"course_lib.hello", "course_lib.train_gpt",
                            "course_lib.exercises"} <= set(listed)
    assert not set(commands.INTERNAL) & set(listed)
    assert "course_lib.cost_models" not in listed
    for module in (*COMMANDS, *commands.INTERNAL, "course_lib.benchmarks.gpu_check"):
        assert commands.has_a_command(module)
    assert commands.has_a_command("course_lib") is False  # a package without __main__.py
    assert commands.has_a_command("course_lib.no_such_module") is None  # Python will say so


def test_the_module_is_read_from_the_interpreters_arguments():
    read = commands.module_run_with_dash_m
    assert read(["python", "-m", "course_lib.zero", "--steps", "3"]) == "course_lib.zero"
    assert read(["python", "-u", "-X", "dev", "-W", "ignore", "-m", "a.b"]) == "a.b"
    assert read(["python", "-mcourse_lib.x"]) == read(["python", "-um", "course_lib.x"])
    for argv in (["python"], ["python", "script.py", "-m", "x"], ["python", "-c", "code"],
                 ["python", "-Ic", "code"], ["python", "-"]):
        assert read(argv) is None


def test_the_refusal_leaves_other_processes_alone():
    refuse = commands.refuse_modules_without_a_command
    for argv in (["python", "-m", "pytest"], ["python", "-m", "course_lib.hello"],
                 ["python", "-m", "course_lib.runtime.worker", "dir", "0"],
                 ["python", "-m", "course_lib.exercises", "grade"], ["python", "x.py"]):
        refuse(argv)  # returns
    with pytest.raises(SystemExit) as stopped:
        refuse(["python", "-m", "course_lib.cost_models"])
    assert stopped.value.code == 2
