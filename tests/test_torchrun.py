"""The same experiment through launch and under torchrun (course_lib.runtime.torchrun,
course_lib.hello)."""

import os
import subprocess
import sys

import pytest
import torch

from course_lib import hello
from course_lib.runtime import torchrun as cluster
from course_lib.runtime.devices import choose_backend

# what hello reports as carrying the tensors: gloo alone without GPUs, gloo and NCCL with them
CARRIER = "cpu:gloo,cuda:nccl" if "nccl" in choose_backend("auto", 2) else "gloo"


def test_run_experiment_outside_torchrun_uses_launch():
    results = cluster.run_experiment(hello.hello_all_reduce, world_size=2)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["all_reduce_sum"] == pytest.approx(hello.expected_sum(2)) for r in results)


def test_this_process_was_not_started_by_torchrun(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert not cluster.launched_by_torchrun()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cluster.launched_by_torchrun()


def test_module_runs_with_python_dash_m(capfd):
    hello.main(["--world-size", "2"])
    out = capfd.readouterr().out
    assert "[rank 1] hello from rank 1 of 2" in out
    assert f"backend {CARRIER}, device" in out
    assert "all-reduce over 2 ranks gave [3.0, 3.0]" in out


@pytest.mark.parametrize(("config", "carrier"), [
    ("cpu:gloo,cuda:gloo", "gloo"), ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"),
    ("cuda:nccl", "cuda:nccl"), ("gloo", "gloo")])
def test_hello_names_the_backend_that_carries_the_tensors(monkeypatch, config, carrier):
    monkeypatch.setattr(hello.dist, "get_backend_config", lambda group=None: config)
    assert hello.carrier() == carrier


def test_same_experiment_runs_under_torchrun():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "course_lib.hello"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "all-reduce over 2 ranks gave [3.0, 3.0]" in done.stdout
    assert "hello from rank 0 of 2" in done.stdout and "hello from rank 1 of 2" in done.stdout
    assert f"backend {CARRIER}, device" in done.stdout


def test_experiment_parser_has_the_shared_options():
    args = cluster.experiment_parser("x").parse_args(["--world-size", "3", "--backend", "gloo"])
    assert (args.world_size, args.backend, args.timeout) == (3, "gloo", 300)
    with pytest.raises(SystemExit):
        cluster.experiment_parser("x").parse_args(["--backend", "mpi"])


@pytest.mark.parametrize("argv, message", [
    (["--timeout", "0"], "argument --timeout: must be above 0, got 0"),
    (["--timeout", "-1"], "argument --timeout: must be above 0, got -1"),
    (["--timeout", "soon"], "argument --timeout: 'soon' is not a number"),
    (["--world-size", "0"], "argument --world-size: must be above 0, got 0"),
    (["--world-size", "1.5"], "argument --world-size: '1.5' is not a whole number")])
def test_a_time_limit_or_world_size_of_zero_or_less_is_a_usage_error(capsys, argv, message):
    with pytest.raises(SystemExit) as stopped:
        cluster.experiment_parser("test").parse_args(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    args = cluster.experiment_parser("test").parse_args(["--timeout", "2.5", "--world-size", "3"])
    assert (args.timeout, args.world_size) == (2.5, 3)


def test_expected_sum():
    assert hello.expected_sum(4) == 10


def _echo(local_batch, lr, group=None):
    import torch.distributed as dist

    return dict(rank=dist.get_rank(group), local_batch=local_batch, lr=lr)


def test_run_command_passes_each_option_to_the_experiment_under_its_flags_name():
    from course_lib.runtime.torchrun import run_command

    options = (("--local-batch", int, 16), ("--lr", float, 0.1))
    args, results = run_command(_echo, "echo", options, ["--lr", "0.5"], world_size=1)
    assert args.world_size == 1 and args.local_batch == 16
    assert results == [dict(rank=0, local_batch=16, lr=0.5)]
    _, results = run_command(_echo, "echo", options, ["--world-size", "2", "--local-batch", "3"])
    assert [r["rank"] for r in results] == [0, 1] and {r["local_batch"] for r in results} == {3}
    with pytest.raises(SystemExit):  # an option's own argparse settings are honoured
        run_command(_echo, "echo", (("--local-batch", int, 16, {"choices": [16, 32]}),
                                    ("--lr", float, 0.1)), ["--local-batch", "3"])



RUN_MAIN = """
import atexit, sys
from course_lib.runtime.torchrun import run_main
atexit.register(lambda: print("interpreter teardown ran", flush=True))
def main():
    print("printed by main", end="")  # no newline: only a flush sends it
    if sys.argv[1] == "raise":
        raise ValueError("a bad option")
run_main(main)
print(" / after run_main")
"""


@pytest.mark.parametrize(("torchrun", "how", "code", "out"), [
    (True, "return", 0, "printed by main"),  # exits at once: no teardown, nothing after
    (True, "raise", 1, "printed by maininterpreter teardown ran\n"),
    (False, "return", 0, "printed by main / after run_main\ninterpreter teardown ran\n"),
])
def test_run_main_skips_teardown_only_after_a_torchrun_command_returned(torchrun, how, code, out):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    if torchrun:
        env.update(RANK="0", WORLD_SIZE="1")
    proc = subprocess.run([sys.executable, "-c", RUN_MAIN, how], capture_output=True, text=True,
                          env=env, timeout=60)
    assert (proc.returncode, proc.stdout) == (code, out), proc.stderr
    assert ("ValueError: a bad option" in proc.stderr) == (how == "raise")


@pytest.mark.skipif(torch.cuda.device_count() >= 2 and torch.distributed.is_nccl_available(),
                    reason="this machine can give two ranks NCCL")
def test_a_backend_the_machine_cannot_give_is_a_usage_error_before_any_worker(capsys):
    from course_lib import collectives, train_gpt

    for main, argv in ((collectives.main, ["--world-size", "2"]), (train_gpt.main, ["--dp", "2"])):
        with pytest.raises(SystemExit) as stopped:
            main(["--backend", "nccl", *argv])
        assert stopped.value.code == 2 and "backend='nccl'" in capsys.readouterr().err
