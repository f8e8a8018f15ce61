"""Checks for lesson 1's exercises: leaky ReLU's backward, the kernel gradient of a depthwise
convolution, and the multiply-adds of the forward and backward passes of the lesson network with
widths and batch drawn for each run (another run's counts are no answer).

Lecture note "BackPropagation for fully-connected and convolutional networks": sections 2, 5-6
and 4. Each check is a probe and a judge (:mod:`course_lib.exercises.common`). The judges'
references are autograd and torch's flop counter, never a hand-written formula; the gradients'
judges draw their inputs themselves and take only the answers from the data (:mod:`.cases`).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from course_lib.exercises import practice
from course_lib.exercises.cases import gradient_by_autograd, gradient_mismatch, merged
from course_lib.exercises.common import (
    ExerciseFailed,
    HiddenTestFailed,
    check_drawn,
    checked,
    grading_seed,
    hidden_seed,
    is_whole,
)

SLOPE = 0.1  # leaky ReLU's slope for z <= 0
TOL = 1e-8  # float64 throughout: a right answer is off by ~1e-15


# -- exercise 1: leaky ReLU's backward (section 2) -----------------------------------------------


def _leaky_cases(seed):
    g = torch.Generator().manual_seed(1)
    cases = {"visible": [torch.randn(shape, generator=g, dtype=torch.float64)
                         for shape in [(1, 4), (5, 3), (2, 3, 4)]]}
    if seed is not None:
        h = torch.Generator().manual_seed(seed)
        cases["hidden"] = [torch.randn(tuple(torch.randint(1, 7, (2,), generator=h).tolist()),
                                       generator=h, dtype=torch.float64) * 3 for _ in range(4)]
    return cases


def _leaky_inputs(seed) -> dict:
    """Each case's Z and upstream gradient dXp (any tensor of Z's shape), by group."""
    return {name: [{"Z": Z, "dXp": torch.linspace(-2.0, 3.0, Z.numel(),
                                                  dtype=torch.float64).reshape(Z.shape)}
                   for Z in shapes] for name, shapes in _leaky_cases(seed).items()}


def _probe_leaky(leaky_relu_backward) -> dict:
    return {name: [dict(case, dZ=leaky_relu_backward(case["dXp"].clone(), case["Z"].clone()))
                   for case in cases] for name, cases in _leaky_inputs(hidden_seed()).items()}


def _leaky_wrong(cases) -> str | None:
    for case in cases:
        right = gradient_by_autograd(lambda z: F.leaky_relu(z, SLOPE), case["Z"], case["dXp"])
        where = f"Z of shape {tuple(case['Z'].shape)}"
        wrong = gradient_mismatch("dQ/dZ", case["dZ"], right, where, TOL)
        if wrong:
            return wrong
    return None


def _judge_leaky(data) -> str:
    data = merged(_leaky_inputs(hidden_seed()), data, ("dZ",))  # inputs drawn here, not read
    wrong = _leaky_wrong(data["visible"])
    if wrong:
        raise ExerciseFailed(wrong)
    if "hidden" in data and _leaky_wrong(data["hidden"]):
        raise HiddenTestFailed("a hidden case failed")
    return f"correct: dQ/dZ agrees with autograd in all {len(data['visible'])} cases"


check_leaky_relu_backward = checked("lesson01.leaky_relu_backward", _probe_leaky, _judge_leaky)
check_leaky_relu_backward.__doc__ = """Check ``leaky_relu_backward(dXp, Z)``: dQ/dZ for leaky ReLU
(z for z > 0, 0.1 z otherwise), against autograd."""


# -- exercise 2: the kernel gradient of a depthwise convolution (sections 5-6) -------------------

# (batch, channels, H, W, kernel, stride, padding)
VISIBLE_DEPTHWISE = [(1, 1, 5, 5, 3, 1, 0), (2, 3, 7, 6, 3, 2, 1), (3, 2, 6, 6, 2, 1, 0)]


def _depthwise_cases(seed):
    cases = {"visible": VISIBLE_DEPTHWISE}
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        draw = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
        cases["hidden"] = [(draw(1, 3), draw(1, 4), draw(5, 9), draw(5, 9), draw(1, 3),
                            draw(1, 2), draw(0, 1)) for _ in range(4)]
    return cases


def _depthwise_inputs(seed) -> dict:
    """Each case's X, K, dOut, stride and padding, by group (one generator for all of them)."""
    g = torch.Generator().manual_seed(2)
    inputs = {}
    for name, cases in _depthwise_cases(seed).items():
        inputs[name] = []
        for batch, c, h, w, k, stride, padding in cases:
            X = torch.randn(batch, c, h, w, generator=g, dtype=torch.float64)
            K = torch.randn(c, 1, k, k, generator=g, dtype=torch.float64)
            shape = F.conv2d(X, K, stride=stride, padding=padding, groups=c).shape
            dOut = torch.randn(shape, generator=g, dtype=torch.float64)
            inputs[name].append({"X": X, "K": K, "dOut": dOut, "stride": stride,
                                 "padding": padding})
    return inputs


def _probe_depthwise(depthwise_kernel_gradient) -> dict:
    return {name: [dict(c, dK=depthwise_kernel_gradient(c["dOut"].clone(), c["X"].clone(),
                                                        c["K"].clone(), c["stride"],
                                                        c["padding"])) for c in cases]
            for name, cases in _depthwise_inputs(hidden_seed()).items()}


def _depthwise_wrong(cases) -> str | None:
    for case in cases:
        X, K, stride, padding = case["X"], case["K"], case["stride"], case["padding"]
        conv = partial(F.conv2d, X, stride=stride, padding=padding, groups=X.shape[1])
        right = gradient_by_autograd(conv, K, case["dOut"])  # conv(kk) = F.conv2d(X, kk, ...)
        where = (f"batch {X.shape[0]}, {X.shape[1]} channels, {X.shape[2]}x{X.shape[3]}, "
                 f"k={K.shape[-1]}, stride {stride}, padding {padding}")
        wrong = gradient_mismatch("dQ/dK", case["dK"], right, where, TOL)
        if wrong:
            return wrong
    return None


def _judge_depthwise(data) -> str:
    data = merged(_depthwise_inputs(hidden_seed()), data, ("dK",))  # inputs drawn here
    wrong = _depthwise_wrong(data["visible"])
    if wrong:
        raise ExerciseFailed(wrong)
    if "hidden" in data and _depthwise_wrong(data["hidden"]):
        raise HiddenTestFailed("a hidden case failed")
    return f"correct: dQ/dK agrees with autograd in all {len(data['visible'])} cases"


check_depthwise_kernel_gradient = checked("lesson01.depthwise_kernel_gradient", _probe_depthwise,
                                          _judge_depthwise)
check_depthwise_kernel_gradient.__doc__ = """Check ``depthwise_kernel_gradient(dOut, X, K, stride,
padding)``: dQ/dK of a depthwise convolution (K of shape (C, 1, k, k), groups = C), against
autograd."""


# -- exercise 3: what the backward pass costs (section 4) ----------------------------------------

# The grader's run draws the network's widths and the batch within these ranges (seeded), so
# that the counts differ (by a factor of about 100) and cannot be copied from another student's
# run; the judge checks that the network and batch are the ones drawn for it. Other runs draw one
# of the practice draws, which the student edition judges by digests (exercises.practice).
CHANNELS_RANGE, HIDDEN_RANGE, BATCH_RANGE = (2, 16), (8, 64), (8, 128)


@practice.practised
def draw_cost_sizes(rng) -> tuple[int, int, int]:
    """Exercise 3's (CHANNELS, HIDDEN, COST_BATCH): ``common.drawn("lesson01.cost_sizes",
    draw_cost_sizes)`` in the notebook (a practice draw; the grader's run draws its own)."""
    return tuple(int(rng.integers(lo, hi + 1))
                 for lo, hi in (CHANNELS_RANGE, HIDDEN_RANGE, BATCH_RANGE))


def cost_variant(channels: int, hidden: int) -> list:
    """The exercise's network (``_layers`` of ``small_cnn(channels=..., hidden=...)``)."""
    return [["conv", 1, channels, 3, 1, 1], "ReLU", "Flatten",
            ["linear", 64 * channels, hidden], "Tanh", ["linear", hidden, 10]]


# Section 7's network, whose counts a student who ignores the drawn widths would give.
SECTION_7 = cost_variant(8, 32)
SECTION_7_BATCH = 32
IMAGE = [1, 8, 8]  # the digits' images: the practice cases' shape


def _layers(module) -> list:
    """The network's layers as plain data: ["conv", c_in, c_out, k, stride, padding],
    ["linear", d_in, d_out], or the name of a layer without multiply-adds."""
    layers = []
    for m in module:
        if isinstance(m, torch.nn.Conv2d):
            layers.append(["conv", m.in_channels, m.out_channels, m.kernel_size[0],
                           m.stride[0], m.padding[0]])
        elif isinstance(m, torch.nn.Linear):
            layers.append(["linear", m.in_features, m.out_features])
        elif isinstance(m, (torch.nn.ReLU, torch.nn.Tanh, torch.nn.Sigmoid, torch.nn.Flatten)):
            layers.append(type(m).__name__)
        else:
            raise ExerciseFailed(f"pass the exercise's torch.nn network (`cost_module`), not one "
                                 f"with a {type(m).__name__}")
    return layers


def _probe_cost(forward_macs, backward_macs, module, batch, image_shape) -> dict:
    """The student's two counts, the run's network (its layers, with the widths drawn in that
    run), its batch and image shape."""
    return {"forward": forward_macs, "backward": backward_macs, "layers": _layers(module),
            "batch": int(batch), "image": [int(s) for s in image_shape]}


def count_macs(layers, batch, image) -> tuple[int, int]:
    """Multiply-adds of one forward and one backward pass (autograd's) of the network described
    by ``layers``. The student edition of the library leaves this out: it is the exercise's
    answer."""
    ### BEGIN SOLUTION
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    build = {"conv": lambda c_in, c_out, k, s, p: torch.nn.Conv2d(c_in, c_out, k, s, p),
             "linear": torch.nn.Linear}
    net = torch.nn.Sequential(*[build[spec[0]](*spec[1:]) if isinstance(spec, list)
                                else getattr(torch.nn, spec)() for spec in layers])
    x = torch.zeros(batch, *image)
    with FlopCounterMode(display=False) as forward:
        out = net(x)
    loss = F.cross_entropy(out, torch.zeros(batch, dtype=torch.long))
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    return forward.get_total_flops() // 2, backward.get_total_flops() // 2
    ### END SOLUTION


def _widths(layers) -> list:
    """The network's [CHANNELS, HIDDEN] (or None) if it is the exercise's network."""
    try:
        return [layers[0][2], layers[3][2]]
    except (IndexError, KeyError, TypeError):
        return [None, None]


def _sizes_drawn(data) -> None:
    """In a graded run: the network's widths and the batch must be the ones drawn for the run."""
    if grading_seed() is None:
        return
    check_drawn("lesson01.cost_sizes", draw_cost_sizes, [*_widths(data["layers"]), data["batch"]])
    if data["layers"] != cost_variant(*_widths(data["layers"])):
        raise ExerciseFailed("pass the exercise's network, cost_module, as drawn in this run")


def _judge_cost(data) -> str:
    """Recount on the run's network and batch (as drawn in that run) with the flop counter."""
    _sizes_drawn(data)
    batch, image = data["batch"], data["image"]
    if not (isinstance(image, list) and [is_whole(n) and 1 <= n <= 64 for n in image] == [1] * 3):
        raise ExerciseFailed("pass the digits' image shape, split.x_train.shape[1:]: (1, 8, 8)")
    for what in ("forward", "backward"):
        if not is_whole(data[what]):
            raise ExerciseFailed(f"give the {what} count as a whole number, not {data[what]!r}")
    try:
        f, b = count_macs(data["layers"], batch, data["image"])
    except NotImplementedError:  # the student edition: the practice draw's digests
        return practice.judge("lesson01.cost_sizes", _case(data),
                              {what: int(data[what]) for what in ("forward", "backward")})
    section_7 = {batch: count_macs(SECTION_7, batch, data["image"]),
                 SECTION_7_BATCH: count_macs(SECTION_7, SECTION_7_BATCH, data["image"])}
    for what, got, right in (("forward", data["forward"], f), ("backward", data["backward"], b)):
        if got == right:
            continue
        index = 0 if what == "forward" else 1
        hints = {counts[index]: (f"that is section 7's network (8 channels, 32 hidden units) on "
                                 f"a batch of {n}: count the one drawn for your run, from its "
                                 f"variables") for n, counts in section_7.items()}
        hints.update({2 * right: "you counted flops: a multiply-add is 2 of them, count it once",
                      right / batch: f"that is per example: the batch has {batch}"})
        if what == "backward":
            hints[2 * f] = ("that is what the hand-written backward does, which also computes "
                            "dQ/dX of the first layer (the images); autograd computes a "
                            "gradient only if something needs it")
            hints[f] = ("the backward of a layer with weights takes two products: dQ/dW and "
                        "dQ/dX (where dQ/dX is needed)")
        hint = hints.get(got, "count layer by layer the multiply-adds of each matrix product "
                              "(section 5 makes the convolution one)")
        side = "larger" if got > right else "smaller"
        raise ExerciseFailed(f"your {what} count {int(got):,} is {side} than the run's: {hint}")
    return (f"correct: {f:,} multiply-adds forward, {b:,} backward on a batch of {batch}: the "
            f"backward costs {b / f:.3g} times the forward")


def _case(data) -> list:
    """The practice case of a check's data: the network's widths, the batch, the image shape."""
    return [*_widths(data["layers"]), data["batch"], data["image"]]


def _practice_answers(case) -> dict:
    forward, backward = count_macs(cost_variant(case[0], case[1]), case[2], case[3])
    return {"forward": [forward], "backward": [backward]}


practice.register("lesson01.cost_sizes", _practice_answers, draw_cost_sizes, [IMAGE])
check_backward_cost = checked("lesson01.backward_cost", _probe_cost, _judge_cost)
check_backward_cost.__doc__ = """Check the multiply-adds of one forward and one autograd backward
pass of the exercise's variant of section 7's network (widths and batch drawn in the run):
``check_backward_cost(forward_macs, backward_macs, cost_module, COST_BATCH, image_shape)``."""
