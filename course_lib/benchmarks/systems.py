"""Systems an emulated device can stand for (``course_lib.runtime.emulation``): the ratio of a
step's gradient all-reduce to its compute on a published model and cluster, from the planner's
``step_time``. Lessons 4, 10 and 12 choose their emulated device's rate so that their own ratio
equals one of these.
"""

from __future__ import annotations

from course_lib import published
from course_lib.plans import Plan
from course_lib.step_time import step_time


def gpt3_xl_data_parallel(gpus: int, sequences_per_gpu: int) -> dict:
    """A system an emulated device can stand for, by the planner's ``step_time``: GPT-3 XL (1.3B
    parameters; Brown et al. 2020) trained data-parallel on ``gpus`` A100s (DGX nodes of 8,
    InfiniBand between them), ``sequences_per_gpu`` sequences of 2048 tokens per GPU and step,
    the gradients all-reduced after backward. Returns its ``compute`` and ``communication``
    seconds, their ``ratio`` and a ``name``."""
    model = published.gpt(layers=24, hidden=2048, heads=16, batch=gpus * sequences_per_gpu)
    plan = Plan(dp=gpus, tp=1, pp=1, micro_batches=sequences_per_gpu)
    t = step_time(model, published.a100_cluster(gpus), plan, overlap=False)
    link = "NVLink" if gpus <= 8 else "InfiniBand"
    return dict(compute=t["compute"], communication=t["data_parallel"],
                ratio=t["data_parallel"] / t["compute"],
                name=f"GPT-3 XL (1.3B) on {gpus} A100s over {link}")


def reference_system() -> dict:
    """What lesson 10's emulated runs stand for: 32 A100s (4 DGX nodes), 8 sequences per GPU."""
    return gpt3_xl_data_parallel(32, 8)
