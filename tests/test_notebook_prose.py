"""The prose of the notebooks holds no measured number (issue: "every claim true").

A number a run measures (a time, a bandwidth, a speedup, an accuracy) changes with the machine
and the seed; typed into markdown it goes stale and then contradicts the output under it. Such
numbers are printed by code, with the sentence that depends on them. This test reads every
markdown cell and fails on a number with a unit of time (s, ms, µs, min), bandwidth (GB/s,
MB/s), speedup (an attached × or x) or share (%) that is not in ``ALLOWED`` below: constants
from a paper, the lecture, a formula, or a parameter the code sets, each with its reason.
"""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# a number not inside a word, an exponent or a LaTeX group: 7.55 s, 0.74 GB/s, 41%, 1.87x, 8×
_NUMBER = r"(?<![\w.^{}\\])\d+(?:[.,]\d+)*"
_PATTERN = re.compile(
    _NUMBER + r"(?:"
    r"\s*(?:ms|µs|us|s|min|GB/s|MB/s|Gbit/s|Gb/s)(?![\w/])"  # time, bandwidth
    r"|%"                                                     # share, accuracy
    r"|[×x](?![\w])"                                          # speedup: 8×, 1.7x (not 2 × 2)
    r"|\s*\\times\s*\$"                                       # LaTeX: $10\times$
    r"|\s+times\s+(?:faster|slower|fewer|more|as)\b"          # 7.8 times faster
    r")")

# notebook prefix -> {the exact text matched: why it may stand in prose}
ALLOWED = {
    "00": {"4 s": "the least timeout the cell sets (max(4, ...))",
           "300 s": "launch's default timeout, a parameter"},
    "01": {"95%": "the threshold the cell's own check asserts"},
    "02": {"1%": "the lecture note's §2.4 example, quoted",
           "60%": "the lecture note's §2.4 figure, quoted to correct it",
           "39.5%": "1 - 0.99^50, a formula (also printed by the cell above it)"},
    "03": {"1 ms": "a rough guide for gloo's latency over loopback, the cell's REFERENCE_MS "
                   "parameter, not measured",
           "1.5 GB/s": "a rough guide for gloo's bandwidth over loopback, the cell's REFERENCE_GBS "
                       "parameter, not measured"},
    "04": {"8×": "256 / 32, the batch ratio of the experiment's parameters",
           "0.6%": "Goyal et al.: 8192 / 1.28 M images",
           "38%": "512 / 1,347: the batch against the digits' training set",
           "20%": "the bound section 3b's own check asserts"},
    "05": {"20 ms": "the padded forward step, a parameter of the cell",
           "40 ms": "the padded backward step, a parameter of the cell",
           "10%": "a question's target bubble",
           "20%": "the bound on step times section 3's own check asserts"},
    "06": {"60 ms": "the window of the timeline figure, a parameter",
           "5%": "the exercises' stated tolerance",
           "5 ms": "exercise 2's visible cluster, section 4's straggler's parameters",
           "40 ms": "exercise 2's visible cluster, section 4's straggler's parameters",
           "30 ms": "exercise 2's second visible cluster, a parameter",
           "8 ms": "the range of the grader's clusters in exercise 2, a parameter"},
    "06b": {"1%": "nnz^2 / d for the sparse problem's parameters, a formula",
            "500×": "DiLoCo's published reduction in communication"},
    "08": {"99%": "the FedAvg paper's MNIST target",
           "90%": "our target accuracy, a parameter",
           "55%": "Zhao et al.'s largest drop, a paper's number",
           "10%": "the closeness threshold percent_off is called with",
           "25%": "a question's drop-out rate"},
    "12": {"18.9%": "Lee et al. 2025's measured average slowdown of overlapped compute, a paper's "
                    "number and the planner's parameter",
           "40%": "Lee et al. 2025's worst measured slowdown, a paper's number",
           "97%": "the threshold the cell's own check asserts",
           "25%": "the bound the cell's own check asserts (the issue's acceptance)",
           "50%": "the kernel speed sections 1 and 2 assume, a parameter (a100_cluster's mfu)"},
    "12b": {"30%": "the bound section 4's own check asserts for plans with few messages",
            "20%": "exercise 2's illustration of a prediction off by one share for every plan, "
                   "a made-up number"},
    "10": {"2x": "the threshold the bucket-size cell's own check asserts (the issue's acceptance)",
           "30%": "the threshold the event-model cell's own check asserts",
           "40%": "the threshold the bucket-size cell's own check asserts"},
    "11": {"40%": "the bound on step times the five-schedule cell's own check asserts"},
    "09": {"30%": "the attacker shares, parameters (10-30%)",
           "20%": "the trimmed mean's trim, a parameter",
           "10\\times$": "the boost factor of the attack, a parameter"},
}


def find_numbers(markdown: str) -> list[str]:
    """Every number-with-a-unit the guard looks for in a piece of markdown."""
    return [m.group(0).strip() for m in _PATTERN.finditer(markdown)]


def markdown_cells(path):
    cells = json.loads(path.read_text())["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "markdown"]


def test_the_guard_catches_typed_measurements():
    # the sentences the issue found, and their kin
    caught = find_numbers("torchrun took 7.55 s against 4.54 s predicted; 1/β is 0.74 GB/s, "
                          "the bus 0.49 GB/s; our ring is 1.87x faster; it reaches about 93%; "
                          "10 kB all-reduces take 2.6 ms; 8× fewer steps; $10\\times$ the update; "
                          "7.8 times fewer rounds")
    assert caught == ["7.55 s", "4.54 s", "0.74 GB/s", "0.49 GB/s", "1.87x", "93%", "2.6 ms",
                      "8×", "10\\times$", "7.8 times fewer"]


def test_the_guard_leaves_shapes_exponents_and_names_alone():
    assert find_numbers("a 2 × 2 mesh, weights of 32 × 16, global batch 128 × m, $2^{16}$ "
                        "times smaller, $\\epsilon = 2^{-10}$, fp16, e4m3, 64 rows, lesson 03, "
                        "x_train, 3 seeds, 0.5–1") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_markdown_holds_no_measured_number(path):
    allowed = ALLOWED.get(path.name.split("_")[0], {})
    found = {}
    for i, text in markdown_cells(path):
        for number in find_numbers(text):
            found.setdefault(number, []).append(i)
    typed = {n: cells for n, cells in found.items() if n not in allowed}
    assert not typed, (
        f"{path.name}: markdown cells {typed} hold numbers with units. If a run measured them, "
        "print them from code (course_lib.report helps with the sentence); if they are constants "
        "from a paper, the lecture, a formula or a parameter, add them to ALLOWED with the reason.")
    stale = set(allowed) - set(found)
    assert not stale, f"{path.name}: ALLOWED lists {stale}, which no longer appear: remove them"
