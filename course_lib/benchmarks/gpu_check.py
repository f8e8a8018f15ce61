"""GPU acceptance: every lesson's rank functions on CUDA, one line each.

    python -m course_lib.benchmarks.gpu_check [--world-sizes 1 2] [--timeout 300]

Launches each lesson's functions with ``backend="auto"`` for world sizes 1 and min(2, GPUs) --
so the ranks get ``cuda:LOCAL_RANK`` and a ``"cpu:gloo,cuda:nccl"`` group -- and prints, per
function: ok (with what was checked) or failed (with the error), and its time. A function is
ok when it ran, its result matches a reference where one is cheap, and the tensors it returned
live on the GPU (except the parameter server's, which keeps its messages in host memory for
gloo by design: it is not among the results checked). Without a GPU it says so and exits 0.
Checks print; they assert nothing.
"""

from __future__ import annotations

import argparse
import time
import traceback

import torch

from course_lib.benchmarks.gpu_cases import CASES
from course_lib.runtime.devices import gpu_count
from course_lib.runtime.launching import launch
from course_lib.runtime.torchrun import positive


def all_on_gpu(value) -> bool:
    """Every tensor in a (nested) result is on a CUDA device."""
    if isinstance(value, torch.Tensor):
        return value.is_cuda
    if isinstance(value, dict):
        return all(all_on_gpu(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(all_on_gpu(v) for v in value)
    return True


def run_case(fn, on_gpu: bool = True):
    """On every rank: run one case; report ok/failed, the time and where the results live.
    (``on_gpu=False`` lets the tests run the cases on CPU ranks.)"""
    start = time.perf_counter()
    try:
        result, detail = fn()
        if on_gpu:
            torch.cuda.synchronize()
        placed = not on_gpu or all_on_gpu(result)
        return dict(ok=placed, seconds=time.perf_counter() - start,
                    detail=detail if placed else f"{detail}; BUT a result is not on the GPU")
    except Exception as err:  # report, do not stop the other cases
        return dict(ok=False, seconds=time.perf_counter() - start,
                    detail=f"{type(err).__name__}: {err}".splitlines()[0][:300],
                    trace=traceback.format_exc())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="*", default=None)
    parser.add_argument("--timeout", type=positive(float), default=300)
    args = parser.parse_args(argv)
    gpus = gpu_count()
    if gpus == 0:
        print("gpu_check: no GPU here (torch.cuda.is_available() is False): nothing to check. "
              "Run this on a machine with CUDA.")
        return 0
    sizes = args.world_sizes or sorted({1, min(2, gpus)})
    print(f"gpu_check: {gpus} GPU(s) ({torch.cuda.get_device_name(0)}), torch {torch.__version__}"
          f", world sizes {sizes}")
    failures = 0
    for p in sizes:
        for lesson, what, smallest, fn in CASES:
            if p < smallest:
                print(f"p={p} lesson {lesson:5s} {what:38s} skipped (needs {smallest} ranks)")
                continue
            start = time.perf_counter()
            try:
                results = launch(run_case, world_size=p, args=(fn,), timeout=args.timeout)
                ok = all(r["ok"] for r in results)
                detail = next((r["detail"] for r in results if not r["ok"]), results[0]["detail"])
            except Exception as err:  # a launch that failed: name it, go on
                ok, detail = False, f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            failures += not ok
            print(f"p={p} lesson {lesson:5s} {what:38s} {'ok    ' if ok else 'FAILED'} "
                  f"{time.perf_counter() - start:6.1f} s  {detail}", flush=True)
    print(f"gpu_check: {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
