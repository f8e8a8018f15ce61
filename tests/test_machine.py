"""The machine report (course_lib.runtime.machine)."""

import os
import subprocess
import sys

import pytest
import torch

from course_lib.runtime import devices as D
from course_lib.runtime import machine as M
from course_lib.runtime.machine import describe_machine, format_machine


def test_describe_machine_reports_cores_gpus_and_backends():
    info = describe_machine()
    assert info["usable_cores"] >= 1 and info["backends"]["gloo"] is True
    assert info["launch_backend_for_2"] in ("gloo", "cpu:gloo,cuda:nccl")
    assert info["launch_backend_for_1"] in ("gloo", "cpu:gloo,cuda:nccl")
    text = format_machine(info)
    assert "gloo yes" in text and "CPU cores" in text and "GPUs:" in text
    assert info["threads_per_worker"] == D.worker_threads()  # what launch gives every worker
    assert f"{info['threads_per_worker']} CPU thread(s) per worker at every world size" in text


def test_the_report_says_the_threads_launch_gives(monkeypatch):
    monkeypatch.setenv("COURSE_LIB_THREADS", "3")
    assert "3 CPU thread(s) per worker" in format_machine(describe_machine())


def test_use_threads_sets_torchs_threads_and_refuses_nonsense(monkeypatch):
    before = torch.get_num_threads()
    try:
        assert M.use_threads(2) == 2 and torch.get_num_threads() == 2
        monkeypatch.setenv("COURSE_LIB_THREADS", "1")
        assert M.use_threads() == 1 and torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="at least 1"):
            M.use_threads(0)
    finally:
        torch.set_num_threads(before)


def test_importing_course_lib_computes_in_one_thread():
    code = "import torch, course_lib; print(torch.get_num_threads())"
    env = {k: v for k, v in os.environ.items() if k != "COURSE_LIB_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    assert out.stdout.strip() == "1"
