"""Layer split and hand-written pipelines (course_lib.pipeline) against one process."""

import pytest
import torch

from course_lib import WorkerError, launch
from course_lib import pipeline as pp
from course_lib.cost_models import bubble_fraction, idle_fraction, pipeline_timeline
from course_lib.models import mlp
from course_lib.runtime.timing import Timeline


def mlp_stages(p, width=32, layers_per_stage=2):
    """An MLP of p x layers_per_stage linear layers for the digits, cut into p stages."""
    sizes = (64, *[width] * (p * layers_per_stage - 1), 10)
    return pp.split_into_stages(mlp(sizes, activation=torch.nn.Tanh, dtype=torch.float64), p)


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 64, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 10, (16,), generator=g)


def test_one_f_one_b_order_has_named_phases():
    assert pp.one_f_one_b_schedule(0, 4, 6) == [
        ("forward", 0), ("forward", 1), ("forward", 2),                      # warm-up
        ("forward", 3), ("backward", 0), ("forward", 4), ("backward", 1),     # steady 1F1B
        ("forward", 5), ("backward", 2),
        ("backward", 3), ("backward", 4), ("backward", 5)]                   # cool-down
    last = pp.one_f_one_b_schedule(3, 4, 3)
    assert last == [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1),
                    ("forward", 2), ("backward", 2)]
    # (2, 2, 3) gave ("forward", -1); (0, 2.5, 3) a TypeError from range
    for stage, stages, m in ((2, 2, 3), (-1, 2, 3), (0, 2, 0), (0, 2.5, 3), (0, 2, 2.0),
                             (True, 2, 3)):
        with pytest.raises(ValueError, match="a stage is 0 to stages - 1 and micro-batches"):
            pp.one_f_one_b_schedule(stage, stages, m)


@pytest.mark.parametrize("name", ["GPipe", "1F1B"])
@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 8), (4, 2), (3, 5)])
def test_every_schedule_runs_each_micro_batch_forward_then_backward_once(name, p, m):
    for stage in range(p):
        schedule = pp.SCHEDULES[name](stage, p, m)
        assert sorted(schedule) == sorted([("forward", i) for i in range(m)]
                                          + [("backward", i) for i in range(m)])
        for i in range(m):
            assert schedule.index(("forward", i)) < schedule.index(("backward", i))


@pytest.mark.parametrize("p, m", [(2, 8), (4, 8), (4, 2)])
def test_gpipe_holds_m_activations_and_1f1b_at_most_p(p, m):
    for stage in range(p):
        assert pp.peak_live_activations(pp.gpipe_schedule(stage, p, m)) == m
        one_f_one_b = pp.one_f_one_b_schedule(stage, p, m)
        assert pp.peak_live_activations(one_f_one_b) == min(p - stage, m)


@pytest.mark.parametrize("stage, stages, m", [(5, 2, 3), (0, 2, -3), (0, 2, 2.5), (-1, 2, 2)])
def test_gpipe_refuses_a_stage_or_micro_batches_that_do_not_exist(stage, stages, m):
    # it used to return [] or a schedule for stage 5 of 2
    with pytest.raises(ValueError, match="a stage is 0 to stages - 1"):
        pp.gpipe_schedule(stage, stages, m)


def test_stages_compose_to_the_whole_model():
    pieces = mlp_stages(3, width=8)
    x = torch.randn(2, 64, dtype=torch.float64)
    out = x
    for piece in pieces:
        out = piece(out)
    assert out.shape == (2, 10)


@pytest.mark.parametrize("layers, p, lengths", [(5, 4, [2, 1, 1, 1]), (10, 4, [3, 3, 2, 2]),
                                                (9, 6, [2, 2, 2, 1, 1, 1]), (7, 2, [4, 3]),
                                                (4, 4, [1, 1, 1, 1]), (3, 1, [3])])
def test_stages_differ_by_at_most_one_layer_and_none_is_empty(layers, p, lengths):
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(layers)])
    pieces = pp.split_into_stages(model, p)
    assert [len(piece) for piece in pieces] == lengths
    assert [m for piece in pieces for m in piece] == list(model)  # in order, each once
    for bad in (0, layers + 1, 2.0):
        with pytest.raises(ValueError, match=f"cannot cut {layers} layers into .* stages: p must"):
            pp.split_into_stages(model, bad)


@pytest.mark.parametrize("schedule, m", [("GPipe", 1), ("GPipe", 4), ("1F1B", 4), ("1F1B", 8)])
def test_pipeline_on_two_ranks_gives_the_single_process_loss_and_gradients(batch, schedule, m):
    x, y = batch
    pieces = mlp_stages(2, width=16)
    loss, grads = pp.reference_gradients(pieces, x, y)
    results = launch(pp.run_pipeline, 2, args=(pieces, x, y, m, schedule))
    assert results[1]["loss"] == pytest.approx(loss, abs=1e-12)
    got = results[0]["grads"] + results[1]["grads"]
    assert len(got) == len(grads)
    for g, want in zip(got, grads, strict=True):
        torch.testing.assert_close(g, want, atol=1e-10, rtol=0)
    for r in results:
        assert r["order"] == pp.SCHEDULES[schedule](r["stage"], 2, m)
        assert r["peak_activations"] == pp.peak_live_activations(r["order"])


def test_frozen_parameters_and_a_stage_without_weights_match_one_process(batch):
    x, y = batch
    frozen = mlp_stages(2, width=16)
    for q in frozen[0].parameters():  # a frozen first stage, as when fine-tuning a backbone
        q.requires_grad_(False)
    next(frozen[1].parameters()).requires_grad_(False)
    # a first piece without weights (and without a linear layer to give its width)
    bare = [torch.nn.Sequential(torch.nn.Tanh()), *mlp_stages(1, width=16)]
    for pieces in (frozen, bare):
        loss, grads = pp.reference_gradients(pieces, x, y)
        results = launch(pp.run_pipeline, 2, args=(pieces, x, y, 4, "1F1B"))
        assert results[1]["loss"] == pytest.approx(loss, abs=1e-12)
        got = results[0]["grads"] + results[1]["grads"]
        assert [g is None for g in got] == [q.grad is None for q in
                                            torch.nn.Sequential(*pieces).parameters()]
        for g, want in zip(got, grads, strict=True):
            torch.testing.assert_close(g, want, atol=1e-10, rtol=0)  # None where frozen
        assert sum(g is None for g in got) == (5 if pieces is frozen else 0)  # 4 + 1 frozen
    one = mlp_stages(2, width=16)
    next(one[1].parameters()).requires_grad_(False)
    theirs = launch(pp.run_torch_pipeline, 2, args=(one, x, y, 4))
    assert theirs[1]["grads"][0] is None and theirs[1]["grads"][1] is not None
    with pytest.raises(WorkerError, match="unknown schedule 'gpipe'"):
        launch(pp.run_torch_pipeline, 2, args=(one, x, y, 4, "gpipe"))


class Scaled(torch.nn.Module):  # multiplies by a number read from the data: no meta shape
    def forward(self, x):
        return x * x.sum().item()


def test_activations_of_any_shape_cross_stages_and_the_shape_comes_from_the_layers(batch):
    from course_lib.models import digits_cnn
    g = torch.Generator().manual_seed(1)
    images, labels = torch.randn(12, 1, 8, 8, generator=g), torch.randint(0, 10, (12,), generator=g)
    torch.manual_seed(0)
    cnn = pp.split_into_stages(digits_cnn(width=2), 2)  # stage 1 receives a 4-D activation
    pooled = [torch.nn.Sequential(torch.nn.Linear(64, 8, dtype=torch.float64),
                                  torch.nn.MaxPool1d(2)),  # last Linear says 8; 4 are sent
              torch.nn.Sequential(torch.nn.Linear(4, 10, dtype=torch.float64))]
    x, y = batch
    for pieces, inputs, targets in ((cnn, images, labels), (pooled, x, y)):
        assert pp.activation_shape(pieces[:1], inputs[:5])[0][0] == 5
        loss, grads = pp.reference_gradients(pieces, inputs, targets)
        results = launch(pp.run_pipeline, 2, args=(pieces, inputs, targets, 3, "1F1B"))
        assert results[1]["loss"] == pytest.approx(loss, abs=1e-6)
        for got, want in zip(results[0]["grads"] + results[1]["grads"], grads, strict=True):
            torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="cannot find the shape of the one tensor stage 1 .*meta"):
        pp.activation_shape([torch.nn.Sequential(Scaled())], x)


def test_measured_bubble_and_spans_from_a_timeline():
    results = [{"stage": 0, "timeline": Timeline(0, [("forward", 0.0, 1.0), ("idle", 1.0, 3.0),
                                                     ("backward", 3.0, 4.0)])},
               {"stage": 1, "timeline": Timeline(1, [("idle", -5.0, 1.0), ("forward", 1.0, 2.0),
                                                     ("backward", 2.0, 3.0)])}]
    # rank 1's wait before the pipeline started (from -5) is not bubble
    assert pp.measured_bubble(results) == pytest.approx(1 - 4 / 8)
    spans = pp.pipeline_spans(results)
    assert (spans[0][0], spans[0][3]) == (0, "forward")
    assert spans[0][1:3] == pytest.approx((0.0, 1.0))
    assert any(s[0] == 0 and s[3] == "idle" and s[1:3] == pytest.approx((1.0, 2.0)) for s in spans)
    assert (1, 0.0, 1.0, "idle") in spans  # the wait from -5 is cut at the pipeline's start


def test_wrong_number_of_pieces_and_unknown_schedule(batch):
    from course_lib import WorkerError
    x, y = batch
    with pytest.raises(WorkerError, match="one piece per rank"):
        launch(pp.run_pipeline, 2, args=(mlp_stages(3), x, y, 2))
    with pytest.raises(WorkerError, match="unknown schedule"):
        launch(pp.run_pipeline, 2, args=(mlp_stages(2), x, y, 2, "zero-bubble"))


def test_warmup_rounds_do_not_change_the_gradients(batch):
    x, y = batch
    pieces = mlp_stages(2, width=16)
    _, grads = pp.reference_gradients(pieces, x, y)
    results = launch(pp.run_pipeline, 2, args=(pieces, x, y, 4, "1F1B"),
                     kwargs=dict(warmup_rounds=2, forward_seconds=0.001))
    for g, want in zip(results[0]["grads"] + results[1]["grads"], grads, strict=True):
        torch.testing.assert_close(g, want, atol=1e-10, rtol=0)
    kinds = {kind for kind, *_ in results[1]["timeline"].records}
    assert kinds <= {"forward", "backward", "idle"}


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_torch_pipelining_gives_the_same_losses_and_gradients_as_the_hand_written(batch,
                                                                                  schedule):
    x, y = batch
    pieces = mlp_stages(2, width=16)
    ours = launch(pp.run_pipeline, 2, args=(pieces, x, y, 4, schedule))
    theirs = launch(pp.run_torch_pipeline, 2, args=(pieces, x, y, 4, schedule))
    assert len(theirs[1]["micro_losses"]) == 4
    assert theirs[1]["micro_losses"] == pytest.approx(ours[1]["micro_losses"], abs=1e-10)
    for a, b in zip(ours[0]["grads"] + ours[1]["grads"], theirs[0]["grads"] + theirs[1]["grads"],
                    strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 8), (4, 4), (3, 7)])
def test_simulated_schedules_have_exactly_the_formulas_bubble(schedule, p, m):
    spans = pipeline_timeline(p, m, schedule, forward=1.0, backward=2.0)
    assert len(spans) == 2 * p * m
    assert idle_fraction(spans, p) == pytest.approx(bubble_fraction(p, m))


@pytest.mark.parametrize("micro_batches", [3, 7, 16])
def test_uneven_micro_batches_are_weighted_by_size_and_exact(batch, micro_batches):
    x, y = batch  # 16 rows: 3 and 7 do not divide them, 16 gives micro-batches of one row
    pieces = mlp_stages(2, width=16)
    loss, grads = pp.reference_gradients(pieces, x, y)
    results = launch(pp.run_pipeline, 2, args=(pieces, x, y, micro_batches, "1F1B"))
    assert results[1]["loss"] == pytest.approx(loss, abs=1e-12)
    for g, want in zip(results[0]["grads"] + results[1]["grads"], grads, strict=True):
        torch.testing.assert_close(g, want, atol=1e-10, rtol=0)


def test_micro_batch_counts_that_cannot_work_are_refused_clearly(batch):
    from course_lib import WorkerError
    x, y = batch
    with pytest.raises(WorkerError, match="micro_batches must be a whole number between 1 and"):
        launch(pp.run_pipeline, 2, args=(mlp_stages(2), x, y, 17))
    with pytest.raises(WorkerError, match="micro_batches must be a whole number between 1"):
        launch(pp.run_pipeline, 2, args=(mlp_stages(2), x, y, 0))
    with pytest.raises(WorkerError, match="whole number between 1 and the batch size 16, got 2.0"):
        launch(pp.run_pipeline, 2, args=(mlp_stages(2), x, y, 2.0))
    with pytest.raises(WorkerError, match="does not divide into 3 equal parts"):
        launch(pp.run_torch_pipeline, 2, args=(mlp_stages(2), x, y, 3))
    with pytest.raises(WorkerError, match="micro_batches must be a whole number of at least 1"):
        launch(pp.run_torch_pipeline, 2, args=(mlp_stages(2), x, y, 0))


@pytest.mark.parametrize("schedule", [[("fwd", 0), ("fwd", 1)], [("backward", 0), ("forward", 0)],
                                      [("forward", 0), ("forward", 0)], ["forward"]])
def test_peak_live_activations_refuses_what_is_not_a_schedule(schedule):
    with pytest.raises(ValueError, match="each micro-batch's forward before its backward"):
        pp.peak_live_activations(schedule)


def test_torch_pipelining_on_one_stage_is_the_baseline(batch):
    x, y = batch  # p = 1: the one stage takes the inputs and the targets
    pieces = mlp_stages(1, width=16)
    loss, grads = pp.reference_gradients(pieces, x, y)
    (result,) = launch(pp.run_torch_pipeline, 1, args=(pieces, x, y, 4, "1F1B"))
    assert sum(result["micro_losses"]) / 4 == pytest.approx(loss, abs=1e-10)
    for got, want in zip(result["grads"], grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
