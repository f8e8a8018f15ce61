"""Benchmark: the speed a class feels -- starting workers, and simulating federated rounds.

Lecture: slides part 1 (what a parallel step costs before any work is done) and part 4
(federated learning, simulated). Prints, from one run, asserts nothing:

    python -m course_lib.benchmarks.speed [--repeats 5] [--rounds 5]

* launching 2 ranks that do one all-reduce: ``launch`` warm (forked by the fork server) and
  cold (new interpreters), ``torchrun`` and ``torch.multiprocessing.spawn``; medians, spreads
  and each as a ratio of torchrun's median (the kit's target: warm <= 0.1);
* federated rounds per second on the digits, 50 clients all chosen every round, E = 5, B = 10:
  the batched engine (``client_batch``) against the per-client loop, the two taking turns
  (the kit's target: batched >= 5x the loop).
"""

from __future__ import annotations

import argparse

from course_lib import federated as fl
from course_lib import partitions as pt
from course_lib.benchmarks.launch import compare_launchers, format_comparison
from course_lib.data import load_digits
from course_lib.runtime.timing import Timing, measure_interleaved
from course_lib.runtime.torchrun import positive

CLIENTS, LOCAL = 50, fl.LocalTraining(epochs=5, batch=10, lr=0.1)


def federated_rounds(repeats: int = 5, rounds: int = 5) -> dict[str, Timing]:
    """Seconds per round of FedAvg with every one of 50 clients, batched and looped."""
    digits = load_digits()
    parts = pt.label_shards(digits.y_train.numpy(), CLIENTS)

    def runner(batched):
        return lambda: fl.federated(digits, parts, LOCAL, fl.Federation(rounds, fraction=1.0),
                                    batched=batched)

    timings = measure_interleaved({"batched": runner(True), "loop": runner(False)},
                                  repeats=repeats, warmup=1)
    return {name: Timing([t / rounds for t in timing.times]) for name, timing in timings.items()}


def format_rounds(timings: dict[str, Timing]) -> str:
    rows = [f"{'engine':<8} {'rounds/s':>9} {'s/round':>9} {'IQR':>8}"]
    for name, t in timings.items():
        rows.append(f"{name:<8} {1 / t.median:>9.1f} {t.median:>9.3f} {t.spread:>8.3f}")
    ratio = timings["loop"].median / timings["batched"].median
    rows.append(f"batched / loop: {ratio:.1f}x the rounds per second (target: at least 5x)")
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive(int), default=5)
    parser.add_argument("--rounds", type=positive(int), default=5)
    args = parser.parse_args(argv)
    print(f"Launching 2 ranks, one all-reduce: 1 warm-up and {args.repeats} timed runs each")
    launches = compare_launchers(2, args.repeats, warmup=1)
    print(format_comparison(launches))
    ratio = launches["launch, warm"].median / launches["torchrun"].median
    print(f"warm launch / torchrun: {ratio:.2f} (target: at most 0.10)\n")
    print(f"FedAvg on the digits, {CLIENTS} clients per round, E = {LOCAL.epochs}, "
          f"B = {LOCAL.batch}: {args.repeats} runs of {args.rounds} rounds each")
    rounds = federated_rounds(args.repeats, args.rounds)
    print(format_rounds(rounds))
    return launches, rounds


if __name__ == "__main__":
    main()
