"""Hogwild!: lock-free SGD by several processes on one model in shared memory.

Slides "Parallel computing for machine learning", part 2 (shared memory vs message passing;
Hogwild! is cited) and Niu et al. 2011: when each update touches only a few coordinates (a
sparse problem), processes may read and write the shared parameters without any lock — they
rarely touch the same coordinate, and when they do the damage is small — and the speedup is near
linear.

The model lives in shared memory (``Tensor.share_memory_``), so this lesson needs processes on
one machine and the CPU, not torch.distributed: there are no messages to send, and a GPU's
memory is not shared with other processes this way. The processes are started by
``torch.multiprocessing`` with the spawn method, so they are fresh interpreters and the workers'
code lives here, in an importable module. One pool of processes runs every configuration, each
on its own model, in turns (``turns``); a barrier separates epochs, so the parent can time each
epoch and evaluate the model.
"""

from __future__ import annotations

import math
import numbers
import queue
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np
import torch
import torch.multiprocessing as mp

from course_lib.runtime.errors import LaunchTimeout, WorkerError


@dataclass
class SparseProblem:
    """Logistic regression where sample j has ``nnz`` non-zero features: their ``indices[j]``
    and ``values[j]``; labels ``y`` in {-1, +1}; ``d`` features in all."""

    indices: np.ndarray
    values: np.ndarray
    y: np.ndarray
    d: int

    @property
    def n(self) -> int:
        return len(self.y)

    def loss(self, w) -> float:
        """(1/n) sum_j log(1 + exp(-y_j x_j . w)); no regulariser, so an update stays sparse."""
        w = np.asarray(w)
        margins = (self.values * w[self.indices]).sum(axis=1)
        return float(np.logaddexp(0.0, -self.y * margins).mean())

    def collision_probability(self) -> float:
        """P(two random samples share a coordinate) = 1 - C(d - k, k) / C(d, k): how often two
        simultaneous updates can overwrite each other."""
        k, d = self.indices.shape[1], self.d
        return 1.0 - math.prod((d - k - i) / (d - i) for i in range(k))


def sparse_logistic_problem(n: int = 20_000, d: int = 10_000, nnz: int = 10,
                            noise: float = 0.05, seed: int = 0) -> SparseProblem:
    """A synthetic sparse classification problem (in the spirit of text data, where each document
    has a few of many words): labels from a random w*, a fraction ``noise`` flipped."""
    whole = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (n, d, nnz))
    if not (whole and 1 <= nnz <= d and n >= 1 and 0 <= noise <= 1):
        raise ValueError(f"need whole numbers n >= 1 and 1 <= nnz <= d, and 0 <= noise <= 1, got "
                         f"n={n!r}, d={d!r}, nnz={nnz!r}, noise={noise!r}")
    rng = np.random.default_rng(seed)
    indices = np.stack([rng.choice(d, nnz, replace=False) for _ in range(n)])
    values = rng.normal(size=(n, nnz)) / math.sqrt(nnz)
    w_star = rng.normal(size=d) * 3
    y = np.sign((values * w_star[indices]).sum(axis=1))
    y[rng.random(n) < noise] *= -1
    return SparseProblem(indices, values, np.where(y == 0, 1.0, y), d)


def sgd_updates(w: np.ndarray, problem: SparseProblem, rows, lr: float, lock=None) -> None:
    """Plain SGD, one sample at a time, on the shared parameters ``w``: read the sample's
    coordinates, compute, write them back. With a ``lock`` the read-compute-write is exclusive;
    without (Hogwild!) another process may write in between."""
    indices, values, y = problem.indices, problem.values, problem.y
    for j in rows:
        idx, x = indices[j], values[j]
        if lock is not None:
            lock.acquire()
        margin = w[idx] @ x
        w[idx] += (lr * y[j] / (1.0 + math.exp(y[j] * margin))) * x
        if lock is not None:
            lock.release()


def epoch_order(n: int, seed: int, config: int, epoch: int) -> np.ndarray:
    """The samples of one epoch, shuffled; process i of p takes every p-th from position i."""
    return np.random.default_rng([seed, config, epoch]).permutation(n)


def turns(configs: int, epochs: int) -> list[tuple[int, int]]:
    """The order of the timed epochs, as (epoch, configuration) pairs: epoch 0 of every
    configuration, then epoch 1 of every one, and so on. A busy moment of the machine then slows
    each configuration alike, not one run."""
    return [(e, c) for e in range(epochs) for c in range(configs)]


def _worker(index, models, problem, configs, epochs, lr, seed, barrier, lock, errors, timeout):
    try:
        torch.set_num_threads(1)
        shared = [w.numpy() for w in models]  # views: writes go to the shared memory
        for e, c in turns(len(configs), epochs):
            processes, locked = configs[c]
            barrier.wait(timeout)  # start of configuration c's epoch e
            if index < processes:
                rows = epoch_order(problem.n, seed, c, e)[index::processes]
                sgd_updates(shared[c], problem, rows, lr, lock if locked else None)
            barrier.wait(timeout)  # its end
    except threading.BrokenBarrierError:
        return  # someone else failed, or the parent gave up: nothing to add
    except BaseException as exc:  # report, then wake everyone so nobody waits for us
        errors.put((index, type(exc).__name__, str(exc), traceback.format_exc()))
        barrier.abort()


def _check_configs(configs, epochs):
    if not configs:
        raise ValueError("configs is empty: pass a list of (processes, locked) pairs")
    def whole(n):  # numpy's integers too; True and False are not counts
        return isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1

    for processes, locked in configs:
        if not whole(processes) or not isinstance(locked, bool):
            raise ValueError(f"each config is (processes >= 1, locked True/False), got "
                             f"{(processes, locked)!r}")
    if not whole(epochs):
        raise ValueError(f"epochs must be a positive int, got {epochs!r}")


def _failure(procs, errors, timeout):
    """The error to raise after the barrier broke: a process raised, died, or hung."""
    try:
        index, kind, message, text = errors.get(timeout=2)
        return WorkerError(f"Hogwild process {index} raised {kind}: {message}\n\n{text}",
                           rank=index, exc_type=kind, exc_message=message,
                           worker_traceback=text)
    except queue.Empty:
        pass
    for index, proc in enumerate(procs):
        if proc.exitcode not in (None, 0):
            return WorkerError(f"Hogwild process {index} died (exit code {proc.exitcode}) "
                               f"without a Python error: out of memory, or killed?",
                               rank=index, exitcode=proc.exitcode)
    return LaunchTimeout(f"the Hogwild processes did not finish an epoch in {timeout} s; "
                         f"raise timeout= for bigger problems", ranks=list(range(len(procs))),
                         timeout=timeout)


def hogwild(problem: SparseProblem, configs, *, epochs: int = 3, lr: float = 0.5,
            seed: int = 0, timeout: float = 120) -> list[dict]:
    """Train from w = 0 once per configuration ``(processes, locked)``, ``epochs`` epochs each.

    Each configuration trains its own model; they take turns epoch by epoch (``turns``). Returns
    one dict per configuration: its ``processes`` and ``locked``, the ``losses`` before and after
    every epoch, the wall-clock ``seconds`` of every epoch and ``updates_per_second``
    (median over epochs). Raises ``WorkerError`` naming the process that failed, or
    ``LaunchTimeout``; every process is stopped in all cases.
    """
    _check_configs(configs, epochs)
    ctx = mp.get_context("spawn")
    pool = max(p for p, _ in configs)
    models = [torch.zeros(problem.d, dtype=torch.float64).share_memory_() for _ in configs]
    barrier, lock, errors = ctx.Barrier(pool + 1), ctx.Lock(), ctx.Queue()
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(i, models, problem, configs, epochs, lr, seed, barrier, lock, errors,
                               timeout)) for i in range(pool)]
    results = [dict(processes=processes, locked=locked, losses=[], seconds=[])
               for processes, locked in configs]
    try:
        for proc in procs:
            proc.start()
        for _, c in turns(len(configs), epochs):
            try:
                barrier.wait(timeout)
                start = time.perf_counter()
                barrier.wait(timeout)
            except threading.BrokenBarrierError:
                raise _failure(procs, errors, timeout) from None
            results[c]["seconds"].append(time.perf_counter() - start)
            results[c]["losses"].append(problem.loss(models[c]))
        for run in results:
            run["losses"].insert(0, problem.loss(np.zeros(problem.d)))  # where every run starts
            run["updates_per_second"] = problem.n / float(np.median(run["seconds"]))
        return results
    finally:
        barrier.abort()  # wakes any process still waiting
        for proc in procs:
            if proc.pid is None:
                continue  # never started: its start raised, and that error goes on up
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
                proc.join()
        errors.close()
