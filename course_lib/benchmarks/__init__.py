"""Benchmarks: they print measurements (medians and spreads), never assert them.

    python -m course_lib.benchmarks.launch          # starting workers: launch, torchrun, spawn
    python -m course_lib.benchmarks.data_parallel   # ring vs the library's all-reduce; DDP speedup
    python -m course_lib.benchmarks.gpu_check       # every lesson's rank functions on the GPUs
"""
