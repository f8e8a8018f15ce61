"""Pipeline schedules: which forward and backward steps a stage takes, in which order.

Course article: GPipe (Huang et al. 2019) runs every micro-batch's forward, then every backward;
1F1B / PipeDream-Flush (Narayanan et al. 2021) fills the pipe, then alternates one forward and
one backward, so a stage holds at most p micro-batches' activations instead of m. A schedule is
a list of ("forward", i) and ("backward", i) actions; :mod:`course_lib.pipeline` carries them out
on ranks (and re-exports these names).
"""

from __future__ import annotations

from course_lib.training import is_whole


def check_schedule(stage, stages, micro_batches) -> None:
    """Refuse, naming them, a stage, stages or micro-batches no schedule can have."""
    whole = all(map(is_whole, (stage, stages, micro_batches)))
    if not (whole and 0 <= stage < stages and micro_batches >= 1):
        raise ValueError(f"stage {stage!r} of {stages!r} stages with {micro_batches!r} "
                         f"micro-batches: whole numbers, a stage is 0 to stages - 1 and "
                         f"micro-batches are at least 1")


def gpipe_schedule(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """GPipe: all forward passes, then all backward passes (the same on every stage)."""
    check_schedule(stage, stages, micro_batches)
    forwards = [("forward", i) for i in range(micro_batches)]
    backwards = [("backward", i) for i in range(micro_batches)]
    return forwards + backwards


def one_f_one_b_schedule(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """1F1B: a few forwards to fill the pipe, then alternate one forward and one backward, then
    drain. Stage s starts p - s - 1 forwards ahead, so the last stage alternates at once."""
    check_schedule(stage, stages, micro_batches)
    warmup = min(stages - stage - 1, micro_batches)
    actions = [("forward", i) for i in range(warmup)]  # warm-up forward passes
    forward, backward = warmup, 0
    while forward < micro_batches:  # 1F1B steady state
        actions.append(("forward", forward))
        forward += 1
        actions.append(("backward", backward))
        backward += 1
    while backward < micro_batches:  # cool-down backward passes
        actions.append(("backward", backward))
        backward += 1
    return actions


SCHEDULES = {"GPipe": gpipe_schedule, "1F1B": one_f_one_b_schedule}


def peak_live_activations(schedule) -> int:
    """Most micro-batches whose activations a stage holds at once under ``schedule``."""
    live, peak, alive = 0, 0, set()
    for action in schedule:
        kind, i = action if isinstance(action, tuple | list) and len(action) == 2 else (None, None)
        if kind not in ("forward", "backward") or (kind == "backward") != (i in alive):
            raise ValueError(f"a schedule is (\"forward\", i) and (\"backward\", i) actions, "
                             f"each micro-batch's forward before its backward; got {action!r}")
        alive ^= {i}
        live += 1 if kind == "forward" else -1
        peak = max(peak, live)
    return peak
