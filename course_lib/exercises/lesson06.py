"""Checks for lesson 6's exercises: asynchronous SGD and staleness.

Slides part 2; Zhang et al. 2016.
"""

from __future__ import annotations

from course_lib.exercises.common import ExerciseFailed


def check_staleness_aware_lr(rule) -> str:
    """Check ``rule(alpha, staleness)`` against Zhang et al.'s alpha / tau (alpha for a fresh
    gradient, tau = 0), then train 16 simulated asynchronous workers with it."""
    from course_lib import async_sgd
    from course_lib.erm import diabetes_problem
    from course_lib.parameter_server import sgd

    for alpha in (0.1, 0.3):
        for tau in (0, 1, 2, 7):
            want = async_sgd.staleness_aware_lr(alpha, tau)
            try:
                got = rule(alpha, tau)
            except ZeroDivisionError:
                raise ExerciseFailed(f"rule({alpha}, {tau}) divides by zero: a fresh gradient "
                                     f"(staleness 0) keeps the full rate alpha") from None
            if got is None or not isinstance(got, (int, float)):
                raise ExerciseFailed(f"rule({alpha}, {tau}) returned {got!r}: return a number")
            if abs(got - want) > 1e-12:
                raise ExerciseFailed(f"rule({alpha}, {tau}) = {got:g} but should be {want:g}: "
                                     f"divide alpha by the staleness (and use alpha for 0)")
    problem = diabetes_problem()
    sync = async_sgd.simulate_parameter_server(problem, 16, sgd(0.1), mode="sync",
                                               gradients=600)
    log = async_sgd.simulate_parameter_server(problem, 16, sgd(0.1, rule), gradients=600,
                                              jitter=0.3)
    final, target = async_sgd.losses(problem, log)[-1], async_sgd.losses(problem, sync)[-1]
    return (f"correct: with 16 simulated asynchronous workers the loss ends at {final:.4f}, "
            f"synchronous SGD at {target:.4f}")
