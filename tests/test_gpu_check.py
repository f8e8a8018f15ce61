"""The GPU acceptance script (course_lib.benchmarks.gpu_check): it says so when there is no GPU,
and every case it runs on GPUs runs -- and checks what it checks -- on CPU ranks."""

import subprocess
import sys

import pytest
import torch

from course_lib import launch
from course_lib.benchmarks import gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")
def test_without_a_gpu_it_says_so_and_exits_0():
    done = subprocess.run([sys.executable, "-m", "course_lib.benchmarks.gpu_check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no GPU here" in done.stdout


@pytest.mark.parametrize("lesson, what, smallest, case", gpu_check.CASES,
                         ids=[f"{lesson} {what}" for lesson, what, _, _ in gpu_check.CASES])
def test_every_case_runs_and_passes_its_own_checks_on_cpu_ranks(lesson, what, smallest, case):
    for result in launch(gpu_check.run_case, 2, args=(case, False), timeout=240):
        assert result["ok"], result.get("trace", result["detail"])


def test_results_off_the_gpu_are_noticed():
    assert gpu_check.all_on_gpu({"a": [1, "x"]})  # no tensors: nothing to complain about
    assert not gpu_check.all_on_gpu({"a": [torch.ones(1)]})
