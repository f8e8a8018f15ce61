"""Checks every lesson uses: say what is wrong, rank by rank, instead of a bare assert.

Lecture: all of them; an exercise that launches workers checks what each rank ended with.

Every check is two halves. Its **probe** runs the student's code in the student's kernel and
returns plain data (numbers, lists, tensors); its **judge** decides from that data alone. In a
notebook, ``check_x(answer)`` runs both and prints the verdict. When the grader runs the
notebook, the probe also sends its data (plain JSON: nothing is unpickled) as a display message
the grader takes out of the kernel's messages, and the grader judges it *outside* the student's
kernel, with the instructor's library, on cases it draws itself (hidden tests, drawn for that
run): patching the checks in the kernel changes nothing.
"""

from __future__ import annotations

import json
import math
import os
import traceback
from pathlib import Path

import torch

from course_lib.exercises import verdicts

GRADING_OUT = "COURSE_LIB_GRADING_OUT"  # set by tests and scripts: where probes write their data
GRADED = "COURSE_LIB_GRADED"  # set by the grader: probes send their data as a display message
DATA_MIME = "application/vnd.course-lib.check-data+json"  # ... of this type, taken out by it
GRADING_SEED = "COURSE_LIB_GRADING_SEED"  # set by the grader: this run's drawn values
# set by the grader only while a check cell runs, from a seed the kernel never sees before: the
# hidden cases of that check; the judge draws them again from the same seed, outside the kernel
HIDDEN_SEED = "COURSE_LIB_HIDDEN_SEED"
JUDGES: dict = {}  # name -> judge, filled as the lesson modules define their checks
STUB_MESSAGE = "write your solution here"  # what the student edition's stubs raise
LIBRARY_HAS_IT = "not in the student edition"  # what its library's stripped references raise
PRACTICE_DRAWS, PRACTICE_SEED = 16, 20261204  # the practice draws (exercises.practice)
NOT_SOLVED, FAILED = "__not_solved__", "__failed__"  # a check's data when there is no answer
_SENT = [0]  # how many records this process has sent: a check that sent none says why


class ExerciseFailed(AssertionError):
    """An exercise's answer is wrong; the message says how."""


class HiddenTestFailed(ExerciseFailed):
    """A hidden case failed; the grader reports only that (the case stays hidden)."""


class NotSolved(ExerciseFailed):
    """The exercise still holds its stub: nothing to judge yet."""


def to_plain(value):
    """``value`` as JSON-ready plain data: tensors and arrays become tagged nested lists."""
    if isinstance(value, torch.Tensor) or type(value).__module__ == "numpy":
        t = torch.as_tensor(value).detach().cpu()
        if t.ndim == 0 and type(value).__module__ == "numpy":
            return t.item()
        return {"__tensor__": t.tolist(), "dtype": str(t.dtype).removeprefix("torch.")}
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ExerciseFailed(f"the answer holds a {type(value).__name__}: return numbers, lists "
                         f"or tensors")


def from_plain(value):
    """The inverse of :func:`to_plain`: tagged lists become tensors again."""
    if isinstance(value, dict) and "__tensor__" in value:
        dtype = getattr(torch, str(value.get("dtype", "float64")), None)
        if not isinstance(dtype, torch.dtype):
            raise ExerciseFailed(f"unknown dtype {value.get('dtype')!r}")
        return torch.tensor(value["__tensor__"], dtype=dtype)
    if isinstance(value, dict):
        return {k: from_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    return value


def launch_checked(fn, world_size: int, args=(), *, timeout: float = 60,
                   hint: str = "every rank must call the same collectives, in the same order"):
    """``launch(fn, ...)`` for a probe: a failed rank or ranks still waiting at ``timeout``
    become an :class:`ExerciseFailed` that names them (and, for a hang, says ``hint``)."""
    from course_lib.runtime import LaunchTimeout, WorkerError, launch

    try:
        return launch(fn, world_size=world_size, args=args, timeout=timeout)
    except WorkerError as err:
        if err.exc_type == "NotImplementedError" or STUB_MESSAGE in str(err.exc_message):
            raise NotSolved("your code still raises NotImplementedError on the ranks: write it "
                            "in the solution cell above, run that cell, then this one") from None
        raise ExerciseFailed(f"rank {err.rank} failed: {err.exc_type or 'exited'}: "
                             f"{err.exc_message or err}") from None
    except LaunchTimeout as err:
        raise ExerciseFailed(f"ranks {err.ranks} were still waiting after {timeout:g} s: "
                             f"{hint}") from None


def is_number(value) -> bool:
    """A finite int or float (not a bool, which Python counts as an int): what a numeric answer
    must be before a judge compares it."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def is_whole(value) -> bool:
    """A number with no fractional part (3 or 3.0; not True, 2.5, nan or inf): a count."""
    return is_number(value) and value == int(value)


def are_numbers(value, n: int) -> bool:
    """A list or tuple of ``n`` numbers (:func:`is_number` each)."""
    return isinstance(value, (list, tuple)) and len(value) == n and all(map(is_number, value))


def as_number(value, what: str) -> float:
    """``value`` as a float: a number, or a one-element tensor's; anything else is refused
    with :class:`ExerciseFailed` naming ``what``."""
    if hasattr(value, "numel") and hasattr(value, "item") and value.numel() == 1:
        value = value.item()
    if not is_number(value):
        raise ExerciseFailed(f"{what} is {value!r}: return a finite number")
    return float(value)


def judge_cases(items, judge_one) -> None:
    """Judge each of ``items`` with ``judge_one(item)`` (what is wrong, or None): a visible case
    that fails raises :class:`ExerciseFailed` with the details, a hidden one (``item["case"]
    ["hidden"]``) only :class:`HiddenTestFailed`, after every visible case was judged."""
    hidden = False
    for item in items:
        wrong = judge_one(item)
        if wrong and item["case"].get("hidden"):
            hidden = True
        elif wrong:
            raise ExerciseFailed(wrong)
    if hidden:
        raise HiddenTestFailed("a hidden case failed")


def grading_seed() -> int | None:
    """The seed of this grading run's drawn values (:func:`drawn`); None outside the grader."""
    seed = os.environ.get(GRADING_SEED)
    return int(seed) if seed and seed.isdigit() else None


def hidden_seed() -> int | None:
    """The seed of the hidden cases of the check that runs now; None outside the grader. In the
    kernel it is there only while a check cell runs; the judge, outside, sees the same one."""
    seed = os.environ.get(HIDDEN_SEED)
    return int(seed) if seed and seed.isdigit() else None


def drawn(name: str, draw):
    """The parameters of exercise ``name`` for this run: ``draw(rng)`` with a numpy generator
    that is fresh on every run -- except in a graded run, where it is seeded by the grading run
    and the name, so that the grader's judge can draw them again and see that they were not
    changed (a number copied from someone else's run then fails, whatever the cells say).
    A draw function marked ``practice`` draws one of a few fixed sets outside a graded run, and
    in a graded run anything but those."""
    import zlib

    import numpy as np

    seed, practised = grading_seed(), getattr(draw, "practice", False)
    if seed is None and practised:  # one of its practice draws
        return draw(practice_rng(name, int(np.random.default_rng().integers(PRACTICE_DRAWS))))
    rng = np.random.default_rng(None if seed is None else [seed, zlib.crc32(name.encode())])
    if seed is None or not practised:
        return draw(rng)
    # a graded run never draws a practice draw: the student edition holds digests of their answers
    known = {json.dumps(to_plain(draw(practice_rng(name, k)))) for k in range(PRACTICE_DRAWS)}
    for _ in range(100):
        value = draw(rng)
        if json.dumps(to_plain(value)) not in known:
            break
    return value


def practice_rng(name: str, k: int):
    """The generator of exercise ``name``'s practice draw ``k`` (0 to PRACTICE_DRAWS - 1): an
    exercise whose draw function has ``practice = True`` (:mod:`~course_lib.exercises.practice`)
    draws one of these outside the grader, so that the student edition can judge its answer."""
    import zlib

    import numpy as np

    return np.random.default_rng([PRACTICE_SEED, zlib.crc32(name.encode()), k])


def check_drawn(name: str, draw, got) -> None:
    """In a graded run, raise :class:`ExerciseFailed` unless ``got`` is what
    ``drawn(name, draw)`` gives (outside a graded run every draw is fresh: nothing to check)."""
    if grading_seed() is not None and to_plain(got) != to_plain(drawn(name, draw)):
        raise ExerciseFailed("the exercise's drawn values were changed: answer for the values "
                             "drawn in this run")


def not_solved(error: BaseException) -> bool:
    """True when ``error`` (or what caused it) says the exercise still holds its stub: a
    :class:`NotSolved`, a ``NotImplementedError``, or the stub's message from a rank."""
    seen, steps = error, 0
    while seen is not None and steps < 20:
        if isinstance(seen, NotSolved) or STUB_MESSAGE in str(seen) or (
                isinstance(seen, NotImplementedError) and LIBRARY_HAS_IT not in str(seen)):
            return True
        seen, steps = seen.__cause__ or seen.__context__, steps + 1
    return False


def _record(folder: str | None, name: str, data) -> None:
    _SENT[0] += 1
    if folder:  # tests and scripts: a file each
        n = len(list(Path(folder).glob("*.json")))
        (Path(folder) / f"{n:03d}-{name}.json").write_text(json.dumps(data))
    if os.environ.get(GRADED):  # the grader's kernel: over the kernel's own messages
        from IPython.display import display

        display({DATA_MIME: {"name": name, "data": data}}, raw=True)


def _verdict(name, probe, judge, graded, args, kwargs) -> str:
    if any(value is ... for value in (*args, *kwargs.values())):
        raise NotSolved("the answer is still `...`: write the code that computes it in the "
                        "solution cell above, run that cell, then this one")
    try:
        data = to_plain(probe(*args, **kwargs))
    except Exception as error:
        if not_solved(error):
            raise NotSolved("your code still raises NotImplementedError: write it in the "
                            "solution cell above, run that cell, then this one") from error
        raise
    _record(os.environ.get(GRADING_OUT), name, data)
    try:
        return judge(from_plain(data))
    except NotImplementedError:  # the student edition's library leaves the reference out
        return ("recorded: the grader judges this exercise (its reference answer is not in "
                "the student edition)")
    except HiddenTestFailed:
        if not graded:
            raise
        return "recorded: the grader judges it"  # hidden cases: judged outside, in private


def checked(name: str, probe, judge):
    """A check: ``probe(*args)`` runs the student's code and returns plain data, ``judge(data)``
    returns a verdict or raises :class:`ExerciseFailed`. The judge is registered under ``name``
    so that the grader can run it outside the kernel.

    In a notebook's kernel the check shows its verdict in a box and never raises
    (:mod:`~course_lib.exercises.verdicts`): an answer not written yet is "not solved yet", a
    wrong one "wrong" with what is wrong; elsewhere it returns the verdict or raises."""
    JUDGES[name] = judge

    def check(*args, **kwargs) -> str | None:
        graded, sent = os.environ.get(GRADING_OUT) or os.environ.get(GRADED), _SENT[0]
        try:
            verdict = _verdict(name, probe, judge, graded, args, kwargs)
        except Exception as error:
            if not verdicts.showing():
                raise
            unsolved = isinstance(error, NotSolved)
            message = str(error) if isinstance(error, ExerciseFailed) else \
                f"your code raised {type(error).__name__}: {error}"
            if _SENT[0] == sent:  # the probe sent nothing: say why there is no answer
                _record(os.environ.get(GRADING_OUT), name,
                        {NOT_SOLVED if unsolved else FAILED: message})
            verdicts.show("not solved yet" if unsolved else "wrong", message,
                          "" if unsolved else "".join(traceback.format_exception(error)))
            return None
        if not verdicts.showing():
            return verdict
        verdicts.show(verdicts.kind_of(verdict), verdict)
        return None

    check.judge_name = name
    check.__doc__ = probe.__doc__
    return check


# the checks by rank and of gradients: their own module, here too (every lesson imports them)
from course_lib.exercises.rank_checks import (  # noqa: E402, F401
    check_gradient,
    check_rank_results,
)
