"""One rule for devices and backends (course_lib.runtime.devices), on faked GPU counts."""

import os
import sys

import pytest
import torch

from course_lib import device, launch
from course_lib.runtime import devices as D

MIXED = "cpu:gloo,cuda:nccl"

# world size -> backend "auto" picks, for each number of GPUs on the node
AUTO = {
    0: {1: "gloo", 2: "gloo", 4: "gloo"},
    1: {1: MIXED, 2: "gloo", 4: "gloo"},  # one GPU: a world of one uses it (a notebook service)
    2: {1: MIXED, 2: MIXED, 4: "gloo"},  # not enough GPUs: one per rank or none
    8: {1: MIXED, 2: MIXED, 4: MIXED},
}


@pytest.mark.parametrize("gpus", sorted(AUTO))
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_auto_backend_table(gpus, world_size):
    assert D.backend_for("auto", world_size, gpus, nccl_available=True) == AUTO[gpus][world_size]


@pytest.mark.parametrize("gpus", sorted(AUTO))
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_nccl_insists_on_a_gpu_per_rank_and_says_how_many_it_found(gpus, world_size):
    if world_size <= gpus:
        assert D.backend_for("nccl", world_size, gpus, nccl_available=True) == MIXED
    else:
        with pytest.raises(ValueError, match=f"world_size={world_size} but {gpus} GPU"):
            D.backend_for("nccl", world_size, gpus, nccl_available=True)


@pytest.mark.parametrize("gpus", sorted(AUTO))
def test_gloo_stays_on_the_cpu_whatever_the_gpus(gpus):
    assert D.backend_for("gloo", 2, gpus, nccl_available=True) == "gloo"


def test_a_build_without_nccl_is_gloo_or_a_clear_error():
    assert D.backend_for("auto", 2, 8, nccl_available=False) == "gloo"
    with pytest.raises(ValueError, match="no NCCL"):
        D.backend_for("nccl", 2, 8, nccl_available=False)
    with pytest.raises(ValueError, match="unknown backend 'mpi'"):
        D.backend_for("mpi", 2, 0, nccl_available=False)


def test_choose_backend_reads_this_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(D.dist, "is_nccl_available", lambda: True)
    assert D.choose_backend("auto", 2) == MIXED
    assert D.choose_backend("auto", 3) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert D.choose_backend("auto", 1) == "gloo"


def test_uses_gpus_reads_a_backend_string():
    assert D.uses_gpus(MIXED) and D.uses_gpus("nccl")
    assert not D.uses_gpus("gloo")


def test_device_outside_a_process_group_is_the_cpu():
    assert device() == torch.device("cpu")


def rank_device():
    return str(device()), os.environ["LOCAL_RANK"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")
def test_device_on_gloo_ranks_is_the_cpu():
    assert launch(rank_device, 2) == [("cpu", "0"), ("cpu", "1")]


def test_device_under_a_gpu_group_is_the_ranks_gpu(monkeypatch):
    monkeypatch.setattr(D.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(D.dist, "get_backend_config", lambda group=None: MIXED)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert device() == torch.device("cuda", 3)


def test_worker_threads_is_the_same_at_every_world_size_and_refuses_nonsense(monkeypatch):
    monkeypatch.delenv("COURSE_LIB_THREADS", raising=False)
    assert D.worker_threads() == 1 and D.worker_threads(2) == 2
    monkeypatch.setenv("COURSE_LIB_THREADS", "3")
    assert D.worker_threads() == 3 and D.worker_threads(1) == 1  # an explicit number wins
    for bad in (0, -2, True, 1.5, "2"):
        with pytest.raises(ValueError, match="at least 1"):
            D.worker_threads(bad)
    for bad in ("0", "two", ""):
        monkeypatch.setenv("COURSE_LIB_THREADS", bad)
        with pytest.raises(ValueError, match="at least 1"):
            D.worker_threads()


def test_usable_cores_and_loopback_interface():
    assert 1 <= D.usable_cores() <= (os.cpu_count() or 1)
    if sys.platform.startswith("linux"):
        assert D.loopback_interface() == "lo"


def test_gpu_count_is_zero_on_this_machine_or_counts_gpus():
    assert D.gpu_count() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
