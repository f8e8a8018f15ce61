"""A judge decides from the cases it draws itself and takes only the student's outputs from the
data (course_lib.exercises.cases, issue 31): the data comes from the student's kernel, where code
can change the hidden cases' inputs, drop a case, or draw them from another seed. Every check with
hidden cases is tried with such forged data here."""

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
import test_exercises_lesson00 as t00
import test_exercises_lesson01 as t01
import test_exercises_lesson02 as t02
import test_exercises_lesson03 as t03
import test_exercises_lesson04 as t04
import test_exercises_lesson05 as t05
import test_exercises_lesson06 as t06
import test_exercises_lesson06b as t06b
import test_exercises_lesson07 as t07
import test_exercises_lesson07b as t07b
import test_exercises_lesson08 as t08
import test_exercises_lesson09 as t09
import test_exercises_lesson10 as t10
import test_exercises_lesson11 as t11
import test_exercises_lesson12 as t12
import test_exercises_lesson12b as t12b
import test_exercises_lesson13 as t13
import torch
import torch.distributed as dist

from course_lib import planner as P
from course_lib.exercises import common
from course_lib.exercises import lesson00 as ex00
from course_lib.exercises import lesson01 as ex01
from course_lib.exercises import lesson02 as ex02
from course_lib.exercises import lesson03 as ex03
from course_lib.exercises import lesson04 as ex04
from course_lib.exercises import lesson05 as ex05
from course_lib.exercises import lesson06 as ex06
from course_lib.exercises import lesson06b as ex06b
from course_lib.exercises import lesson07 as ex07
from course_lib.exercises import lesson07b as ex07b
from course_lib.exercises import lesson08 as ex08
from course_lib.exercises import lesson09 as ex09
from course_lib.exercises import lesson10 as ex10
from course_lib.exercises import lesson11 as ex11
from course_lib.exercises import lesson12 as ex12
from course_lib.exercises import lesson12b as ex12b
from course_lib.exercises import lesson13 as ex13
from course_lib.exercises.cases import gradient_by_autograd, gradient_mismatch, merged

# -- the helper ------------------------------------------------------------------------------------


def test_a_gradient_judge_s_reference_is_autograd_and_its_mismatch_says_where():
    x = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float64)
    upstream = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    right = gradient_by_autograd(lambda z: z ** 3, x, upstream)
    torch.testing.assert_close(right, 3 * x ** 2 * upstream)
    assert x.grad is None  # the caller's tensor is left alone
    assert gradient_mismatch("dQ/dx", right.clone(), right, "a 2x2 case", 1e-8) is None
    wrong = right.clone()
    wrong[1, 0] += 1.0
    message = gradient_mismatch("dQ/dx", wrong, right, "a 2x2 case", 1e-8)
    assert "dQ/dx" in message and "a 2x2 case" in message


def test_merged_takes_the_outputs_from_the_data_and_the_inputs_from_the_judge():
    own = {"visible": {"x": 1}, "hidden": [{"x": 2}, {"x": 3}]}
    data = {"visible": {"x": 10, "y": "a"}, "hidden": [{"x": 20, "y": "b"}, {"x": 30, "y": "c",
                                                                          "z": 0}]}
    assert merged(own, data, ("y",)) == {"visible": {"x": 1, "y": "a"},
                                         "hidden": [{"x": 2, "y": "b"}, {"x": 3, "y": "c"}]}
    assert merged(own, data, ("y",), optional=("z",))["hidden"] == [{"x": 2, "y": "b"},
                                                                   {"x": 3, "y": "c", "z": 0}]
    assert merged({"visible": []}, {"visible": []}, ("y",)) == {"visible": []}


def test_merged_refuses_missing_and_extra_cases_hidden_ones_as_hidden():
    own = {"visible": {"x": 1}, "hidden": [{"x": 2}, {"x": 3}]}
    right = {"visible": {"y": 1}, "hidden": [{"y": 2}, {"y": 3}]}
    for hidden in ([{"y": 2}], [{"y": 2}, {"y": 3}, {"y": 4}], [{"y": 2}, {"z": 3}],
                   [{"y": 2}, [3]], {"y": 2}, None):
        with pytest.raises(common.HiddenTestFailed):
            merged(own, dict(right, hidden=hidden), ("y",))
    with pytest.raises(common.HiddenTestFailed):  # no hidden group in the data
        merged(own, {"visible": {"y": 1}}, ("y",))
    with pytest.raises(common.HiddenTestFailed):  # hidden cases the judge did not draw
        merged({"visible": {"x": 1}}, right, ("y",))
    for visible in ({"z": 1}, None, [{"y": 1}], 1.0):
        with pytest.raises(common.ExerciseFailed, match="check cell as it is") as raised:
            merged(own, dict(right, visible=visible), ("y",))
        assert not isinstance(raised.value, common.HiddenTestFailed)
    with pytest.raises(common.ExerciseFailed, match="'other'") as raised:
        merged(own, dict(right, other=[]), ("y",))
    assert not isinstance(raised.value, common.HiddenTestFailed)
    with pytest.raises(common.HiddenTestFailed):  # not the probe's data at all, hidden drawn
        merged(own, [1, 2], ("y",))
    with pytest.raises(common.ExerciseFailed):
        merged({"visible": {"x": 1}}, "data", ("y",))


def test_merged_refuses_a_visible_case_before_a_hidden_one():
    own = {"hidden": [{"x": 2}], "visible": [{"x": 1}]}
    with pytest.raises(common.ExerciseFailed) as raised:
        merged(own, {"hidden": [], "visible": []}, ("y",))
    assert not isinstance(raised.value, common.HiddenTestFailed)


def test_merged_knows_hidden_cases_in_one_list_by_their_mark():
    own = {"cases": [{"case": {"n": 1}}, {"case": {"n": 2, "hidden": True}}]}
    data = {"cases": [{"case": {"n": 5}, "got": 1}, {"case": {"n": 6, "hidden": False},
                                                     "got": 2}]}
    assert merged(own, data, ("got",)) == {"cases": [{"case": {"n": 1}, "got": 1},
                                                     {"case": {"n": 2, "hidden": True}, "got": 2}]}
    with pytest.raises(common.HiddenTestFailed):
        merged(own, {"cases": data["cases"][:1]}, ("got",))
    with pytest.raises(common.ExerciseFailed) as raised:  # no hidden case drawn: visible data
        merged({"cases": own["cases"][:1]}, data, ("got",))
    assert not isinstance(raised.value, common.HiddenTestFailed)


# -- forged data, check by check -------------------------------------------------------------------
# For each check with hidden cases: a right solution, one right on the visible cases only, and a
# forgery of the hidden cases' inputs that makes the second one's outputs right for the inputs the
# data shows (a judge that read its inputs from the data would pass it).

SEED, OTHER_SEED = "12345", "7"  # the two draw different hidden cases in every check


@dataclass
class Forgery:
    probe: Callable  # solution -> the probe's data
    right: Callable
    wrong: Callable  # right on the visible cases, wrong on the hidden ones
    forge: Callable  # changes the data's hidden inputs (in place), keeping its outputs
    drop: Callable  # removes a hidden case (in place)
    setup: Callable = lambda monkeypatch: None


def mean_low_when_large(x):  # the visible numbers are all within 5 of zero
    mean, largest = t00.right_mean_and_max(x)
    size = torch.tensor([abs(x)], dtype=torch.float64)
    dist.all_reduce(size, op=dist.ReduceOp.MAX)
    return (mean - 1, largest) if size.item() > 5 else (mean, largest)


def mean_max_forge(data):  # values whose mean and largest are what the ranks said
    data["hidden"]["values"] = [[largest, largest, 3 * mean - 2 * largest]
                                for mean, largest in data["hidden"]["ranks"][0]]


LEAKY_SHAPES = {(1, 4), (5, 3), (2, 3, 4)}
DEPTHWISE_X = {(1, 1, 5, 5), (2, 3, 7, 6), (3, 2, 6, 6)}


def leaky_double(dXp, Z):
    return t01.right_leaky(dXp, Z) * (1 if tuple(Z.shape) in LEAKY_SHAPES else 2)


def depthwise_double(dOut, X, K, stride, padding):
    dK = t01.right_depthwise(dOut, X, K, stride, padding)
    return dK if tuple(X.shape) in DEPTHWISE_X else 2 * dK


def scale_hidden(key, shapes_key, shapes):  # upstream x 2 where the answer was doubled
    def forge(data):
        for case in data["hidden"]:
            if tuple(case[shapes_key].shape) not in shapes:
                case[key] = 2 * case[key]
    return forge


def atc_no_combination(problem, params, rows, W, lr):
    if len(params) in (5, 7) and lr in (0.0, 0.05, 0.5):
        return t02.right_atc(problem, params, rows, W, lr)
    return list(t02.stepped(problem, params, rows, lr))


def atc_forge(data):  # W = I: adapting without combining is then right
    for case in data["hidden"]:
        case["W"] = torch.eye(len(case["W"]), dtype=torch.float64)


def small_doubling_plan(monkeypatch):  # two ranks only, to keep the test short
    monkeypatch.setattr(ex03, "runs_for", lambda seed: {"visible": [(2, [5])]} | (
        {} if seed is None else {"hidden": [(2, [3])]}))


def doubling_one_off(tensor):
    return t03.doubling(tensor) + (tensor.numel() == 3)


def doubling_forge(data):  # rank 0's vector one larger: the sum is then one larger
    for run in data["hidden"]:
        run["ranks"][0][0]["x"] = run["ranks"][0][0]["x"] + 1


def weighted_doubled(model, n_local):  # the hidden model has 5 inputs: twice the gradient
    t04.weighted(model, n_local)
    if model[0].in_features != 6:
        for p in model.parameters():
            p.grad *= 2


def lr_doubled(data):  # twice the gradient at the same rate is the gradient at twice the rate
    for case in [item["case"] for item in data["cases"]] if "cases" in data else [data["hidden"]]:
        if case.get("hidden", True):
            case["lr"] *= 2


def gather_forge(data):  # the loss's weights doubled: so are the gradients
    data["hidden"]["r"] = 2 * data["hidden"]["r"]


def staleness_of_a_visible_setting(m, q, k):
    return t06.mean_staleness(*((m, q, k) if (m, q, k) in ex06.VISIBLE_SETTINGS else
                                ex06.VISIBLE_SETTINGS[0]))


def staleness_forge(data):
    for row in data["hidden"]:
        row["m"], row["q"], row["k"] = ex06.VISIBLE_SETTINGS[0]


def rates_of_a_visible_cluster(mode, seconds, bound):
    known = [c for c, _ in ex06.VISIBLE_CLUSTERS]
    return t06.gradients_per_second(mode, seconds if seconds in known else known[0], bound)


def rates_forge(data):
    for row in data["hidden"]:
        row["seconds"], row["bound"] = ex06.VISIBLE_CLUSTERS[0]


def gossip_never_on_hidden(W, eps):  # right on the visible matrices, "never agrees" elsewhere
    visible = [c["W"] for c in ex06b._matrices(None)["visible"]]
    known = any(W.shape == v.shape and torch.equal(W, v) for v in visible)
    return t06b.gossip_steps(W, eps) if known else None


def gossip_forge(data):  # the disconnected graph, whose answer is None, for every hidden case
    for row in data["hidden"]:
        row["W"] = ex06b._matrices(None)["visible"][0]["W"]


CYCLE = [[1], [2], [3], [0]]


def push_sum_on_a_cycle(z, out_neighbours, in_neighbours):  # ignores the hidden graphs
    if z.numel() == 3:
        return t06b.push_sum_step(z, out_neighbours, in_neighbours)
    i, n = dist.get_rank(), dist.get_world_size()
    return t06b.push_sum_step(z, [(i + 1) % n], [(i - 1) % n])


def push_sum_forge(data):
    for case in data["hidden"]:
        case["outs"] = [list(o) for o in CYCLE]


def round_negated(x, generator):
    return t07.right_round(x if x.numel() == 106 else -x, generator)


def round_forge(data):
    data["hidden"]["x"] = -data["hidden"]["x"]


def partition_without_floor(labels, clients, alpha, min_size, seed):
    return t08.with_floor(labels, clients, alpha, min_size if len(labels) == 1347 else 0, seed)


def partition_forge(data):
    for item in data["cases"]:
        if item["case"].get("hidden"):
            item["case"]["min_size"] = 0


def unmask_zeros(received, senders, clients, seed):
    if seed in (1, 2, 3, 7):
        return t09.unmask_sum(received, senders, clients, seed)
    return torch.zeros(received.shape[1], dtype=torch.float64)


def unmask_forge(data):  # every client dropped: nothing to sum
    for item in data["cases"]:
        if item["case"].get("hidden"):
            item["case"]["dropped"] = list(range(item["case"]["clients"]))


def overlapped_undivided(model, micro_batches):  # the hidden model has 5 inputs
    return (t10.overlapped if model[0].in_features == 4 else t10.not_divided)(model, micro_batches)


def momentum_forge(data):
    for item in data["cases"]:
        if item["case"]["hidden"]:
            item["case"]["momentum"] = 0.0


def every_layer_on_hidden(model, plan, budget):
    k = t12.fewest(model, plan, budget)
    return model.layers if model.vocab == 32_000 else k


def block_forge(data):  # the budget that recomputing every layer just fits
    for item in data["cases"]:
        case = item["case"]
        if case["hidden"]:
            model, plan = P.Transformer(**case["model"]), P.Plan(**case["plan"])
            case["budget"] = ex12.block_recompute_bytes(model, plan, model.layers)


def stages_of_one_micro_batch(model, plan):
    return t12b.stages(model, plan if plan.pp == 2 else replace(plan, micro_batches=1))


def stages_forge(data):
    for item in data["hidden"]:
        if item["case"]["plan"]["pp"] != 2:
            item["case"]["plan"]["micro_batches"] = 1


def emulated_run(monkeypatch):  # the run's activations as the reference has them: no launch
    def measure(fn, world, args, timeout):
        drawn = args[0]
        return ex12b.stage_activation_bytes(ex12b.run_model(drawn), P.Plan(
            dp=1, tp=1, pp=2, micro_batches=drawn["micro_batches"]))

    monkeypatch.setattr(ex12b, "launch_checked", measure)


def split_of_a_visible_list(costs, p):  # the first visible list's split for every hidden one
    first, stages = ex12.VISIBLE_SPLITS[0]
    return t12.split_stages(costs, p) if [costs, p] in [list(v) for v in ex12.VISIBLE_SPLITS] \
        else t12.split_stages(first, stages)


def split_forge(data):
    for row in data["hidden"]:
        row["costs"], row["p"] = ex12.VISIBLE_SPLITS[0]


def pairs_of_a_visible_list(predicted, measured):
    first = ex12b.VISIBLE_RANKINGS[0]
    known = [list(m) for _, m in ex12b.VISIBLE_RANKINGS]
    return t12b.pairs_in_order(predicted, measured) if measured in known else \
        t12b.pairs_in_order(*first)


def pairs_forge(data):
    for row in data["hidden"]:
        row["predicted"], row["measured"] = ex12b.VISIBLE_RANKINGS[0]


def ef_forge(data):  # hidden gradients halved: the halved means would then look right
    for case in data["hidden"]:
        case["gradients"] = case["gradients"] / 2


def bytes_forge(data):  # every hidden message the first visible one
    for row in data["hidden"]:
        row["sizes"], row["bits"], row["group"] = ex07b.MLP_SIZES, 1, None


def pop_hidden(data):
    data["hidden"].pop()


def worth_forge(data):  # curves of the data's own for a hidden case: never read
    data["hidden"][0]["curves"] = [[1.0, 0.5], [1.0, 0.5]]


def exposed_by_heart(spans, rank):  # right on the visible steps and the run's, not elsewhere
    known = [[tuple(b) for b in step] for step in (*ex10.VISIBLE, t10.STEP)]
    return t10.exposed(spans, rank) if [tuple(b) for b in spans] in known else [0.0] * 9


def exposed_forge(data):  # hidden steps of the data's own: never read, the judge draws them
    data["hidden"][0]["spans"] = [[1, 0.0, 1.0, "all-reduce"]]


def pop_case(data):
    data["cases"].pop()


def merge_forge(data):  # hidden cases of plain scores, no mask, where averaging looks closer
    for item in data["cases"]:
        if item["case"].get("hidden"):
            item["case"].update(scale=1.0, causal=False, swap=False)


def drop_group(data):
    del data["hidden"]


FORGERIES = {
    "lesson00.mean_and_max": Forgery(ex00._probe_mean_and_max, t00.right_mean_and_max,
                                     mean_low_when_large, mean_max_forge, drop_group),
    "lesson01.leaky_relu_backward": Forgery(ex01._probe_leaky, t01.right_leaky, leaky_double,
                                            scale_hidden("dXp", "Z", LEAKY_SHAPES), pop_hidden),
    "lesson01.depthwise_kernel_gradient": Forgery(
        ex01._probe_depthwise, t01.right_depthwise, depthwise_double,
        scale_hidden("dOut", "X", DEPTHWISE_X), pop_hidden),
    "lesson02.atc_step": Forgery(ex02._probe_atc, t02.right_atc, atc_no_combination, atc_forge,
                                 pop_hidden),
    "lesson03.doubling_all_reduce": Forgery(ex03.probe_doubling, t03.doubling, doubling_one_off,
                                            doubling_forge, pop_hidden, small_doubling_plan),
    "lesson04.epochs_worth": Forgery(lambda fn: ex04._probe_epochs_worth(fn, t04.SEEDED),
                                     t04.epochs_worth, t04.by_heart, worth_forge, pop_hidden),
    "lesson04.weighted_average": Forgery(ex04.probe_weighted_average, t04.weighted,
                                         weighted_doubled, lr_doubled, drop_group),
    "lesson05.gather": Forgery(ex05.probe_gather, t05.Gather, t05.RightOnVisibleOnly,
                               gather_forge, drop_group),
    "lesson06.mean_staleness": Forgery(ex06._probe_staleness, t06.mean_staleness,
                                       staleness_of_a_visible_setting, staleness_forge,
                                       pop_hidden),
    "lesson06.gradients_per_second": Forgery(ex06._probe_rates, t06.gradients_per_second,
                                             rates_of_a_visible_cluster, rates_forge, pop_hidden),
    "lesson06b.push_sum": Forgery(ex06b._probe_push_sum, t06b.push_sum_step,
                                  push_sum_on_a_cycle, push_sum_forge, pop_hidden),
    "lesson06b.gossip_steps": Forgery(ex06b._probe_gossip, t06b.gossip_steps,
                                      gossip_never_on_hidden, gossip_forge, pop_hidden),
    "lesson07.fp16_stochastic_round": Forgery(ex07._probe_fp16_round, t07.right_round,
                                              round_negated, round_forge, drop_group),
    "lesson07b.ef_sign": Forgery(ex07b._probe_ef, t07b.ef_sign_all_reduce, t07b.halved, ef_forge,
                                 pop_hidden),
    "lesson07b.message_bytes": Forgery(ex07b._probe_bytes, t07b.message_bytes,
                                       t07b.bytes_by_heart, bytes_forge, pop_hidden),
    "lesson08.dirichlet_with_floor": Forgery(ex08._probe_partition, t08.with_floor,
                                             partition_without_floor, partition_forge, pop_case),
    "lesson09.unmask_sum": Forgery(ex09._probe_unmask, t09.unmask_sum, unmask_zeros, unmask_forge,
                                   pop_case),
    "lesson10.overlapped": Forgery(ex10._probe_overlapped, t10.overlapped, overlapped_undivided,
                                   lr_doubled, pop_case),
    "lesson10.exposed": Forgery(lambda fn: ex10._probe_exposed(fn, t10.PROFILED), t10.exposed,
                                exposed_by_heart, exposed_forge, pop_hidden),
    "lesson11.zero1": Forgery(ex11._probe_zero1, t11.zero1, t11.right_when_visible,
                              momentum_forge, pop_case),
    "lesson12.block_recompute": Forgery(ex12._probe_block, t12.fewest, every_layer_on_hidden,
                                        block_forge, pop_case),
    "lesson13.merge": Forgery(ex13._probe_merge, t13.right_merge, t13.right_when_visible,
                              merge_forge, pop_case),
    "lesson12.split_stages": Forgery(ex12._probe_split, t12.split_stages,
                                     split_of_a_visible_list, split_forge, pop_hidden),
    "lesson12b.stages": Forgery(lambda fn: ex12b._probe_stages(fn, t12b.DRAWN), t12b.stages,
                                stages_of_one_micro_batch, stages_forge, pop_hidden, emulated_run),
    "lesson12b.pairs_in_order": Forgery(ex12b._probe_pairs, t12b.pairs_in_order,
                                        pairs_of_a_visible_list, pairs_forge, pop_hidden),
}


def test_every_check_with_hidden_cases_is_tried():
    drawn = {"lesson01.backward_cost", "lesson02.rounds_to_match",
             "lesson05.slow_stage_bubble", "lesson07.safe_scale", "lesson07.flushed_fraction",
             "lesson08.uniform_mix", "lesson09.breakdown",
             "lesson11.overhead", "lesson13.capacity_drops"}  # the run's numbers, values drawn
    of_the_run = {"lesson00.prediction", "lesson03.crossover_size"}  # the run's own numbers
    lessons = {name for name in common.JUDGES if name.startswith("lesson")}  # not tests' own
    assert lessons == set(FORGERIES) | drawn | of_the_run


def recorded(probe, solution) -> str:
    """The probe's data as the grader reads it (JSON), to be loaded afresh for each try."""
    return json.dumps(common.to_plain(probe(solution)))


def load(text: str):
    return common.from_plain(json.loads(text))


@pytest.mark.filterwarnings("ignore:.*oversubscribed")  # 4 ranks on 2 cores: correctness only
@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forged_hidden_cases_are_refused(name, monkeypatch):
    spec, judge = FORGERIES[name], common.JUDGES[name]
    spec.setup(monkeypatch)
    monkeypatch.setenv(common.HIDDEN_SEED, SEED)
    right, wrong = recorded(spec.probe, spec.right), recorded(spec.probe, spec.wrong)
    assert "correct" in judge(load(right))
    with pytest.raises(common.HiddenTestFailed):
        judge(load(wrong))
    # (a) the hidden inputs changed so that the wrong outputs are right for them: still wrong;
    # the same change to a right answer's data changes nothing, the inputs are never read
    for text, verdict in ((wrong, None), (right, "correct")):
        forged = load(text)
        spec.forge(forged)
        assert json.dumps(common.to_plain(forged)) != text  # the forgery changed the inputs
        if verdict is None:
            with pytest.raises(common.HiddenTestFailed):
                judge(forged)
        else:
            assert verdict in judge(forged)
    # (b) a hidden case left out
    dropped = load(right)
    spec.drop(dropped)
    with pytest.raises(common.HiddenTestFailed):
        judge(dropped)
    # (c) the hidden cases drawn in the kernel from another seed than the judge's
    monkeypatch.setenv(common.HIDDEN_SEED, OTHER_SEED)
    with pytest.raises(common.HiddenTestFailed):
        judge(load(right))
    # outside a graded run the judge draws no hidden case: data holding some is refused
    monkeypatch.delenv(common.HIDDEN_SEED)
    with pytest.raises(common.HiddenTestFailed):
        judge(load(right))
