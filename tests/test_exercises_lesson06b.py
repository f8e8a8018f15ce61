"""Lesson 6b's checks: each accepts a right answer, explains a wrong one, and judges hidden cases
only in a graded run (course_lib.exercises.lesson06b)."""

import math

import pytest
import torch
import torch.distributed as dist

from course_lib import decentralized as dec
from course_lib.exercises import common
from course_lib.exercises import lesson06b as ex


def push_sum_step(z, out_neighbours, in_neighbours):
    share = z / (len(out_neighbours) + 1)
    received = [torch.empty_like(z) for _ in in_neighbours]
    requests = [dist.isend(share, j) for j in out_neighbours]
    requests += [dist.irecv(buffer, j) for buffer, j in zip(received, in_neighbours, strict=True)]
    for request in requests:
        request.wait()
    return share + sum(received)


def shares_by_out_degree(z, out_neighbours, in_neighbours):  # forgets its own share
    return push_sum_step(z * (len(out_neighbours) + 1) / len(out_neighbours), out_neighbours,
                         in_neighbours)


def gossip_steps(W, eps):
    lam = torch.linalg.matrix_norm(W - 1.0 / len(W), ord=2).item()
    if lam > 1 - 1e-9:
        return None
    return 1 if lam < 1e-12 else math.ceil(math.log(eps) / math.log(lam))


def second_largest(W, eps):  # lambda_2 read as the second largest eigenvalue, not in magnitude
    lam = torch.linalg.eigvalsh(W)[-2].item()
    if lam > 1 - 1e-9:
        return None
    return 1 if lam <= 1e-12 else math.ceil(math.log(eps) / math.log(lam))


@pytest.mark.filterwarnings("ignore:.*oversubscribed")  # 4 ranks on 2 cores: correctness only
def test_push_sum_accepts_the_right_step_and_explains_lost_mass_and_wrong_values():
    assert "correct: every rank's z matches" in ex.check_push_sum(push_sum_step)
    # a step that sends nothing keeps the mass: judged from the data its ranks would return
    # (no launch: the launches above already cover the way there)
    case = ex.push_sum_cases(None)["visible"]
    kept = [case["z0"][i].repeat(ex.STEPS, 1) for i in range(ex.WORLD_SIZE)]
    with pytest.raises(common.ExerciseFailed, match="rank 3 holds .* but should hold"):
        ex.judge_push_sum({"visible": case | {"ranks": kept}})
    with pytest.raises(common.ExerciseFailed, match="neither creates nor loses mass"):
        ex.check_push_sum(shares_by_out_degree)


@pytest.mark.filterwarnings("ignore:.*oversubscribed")
def test_push_sum_judges_the_hidden_graphs_only_in_a_graded_run(monkeypatch, tmp_path):
    def right_on_visible_only(z, out_neighbours, in_neighbours):  # the visible z has 3 entries
        new = push_sum_step(z, out_neighbours, in_neighbours)
        return new if z.numel() == 3 else new * 2

    assert "correct" in ex.check_push_sum(right_on_visible_only)
    monkeypatch.setenv(common.HIDDEN_SEED, "12345")
    with pytest.raises(common.HiddenTestFailed):
        ex.check_push_sum(right_on_visible_only)
    monkeypatch.setenv(common.GRADING_OUT, str(tmp_path))  # the grader's kernel: to a file
    assert "recorded" in ex.check_push_sum(right_on_visible_only)


def test_gossip_steps_accept_the_spectral_norm_and_explain_a_negative_eigenvalue_missed():
    assert "correct: steps to agree" in ex.check_gossip_steps(gossip_steps)
    with pytest.raises(common.ExerciseFailed, match="a 2-node matrix, eps = 0.001: 1 is not right"
                                                    ".*can it be negative"):
        ex.check_gossip_steps(second_largest)
    with pytest.raises(common.ExerciseFailed, match="a 7-node matrix.*0 is not right"):
        ex.check_gossip_steps(lambda W, eps: 0 if gossip_steps(W, eps) is None else
                              gossip_steps(W, eps))  # "never" as 0 steps
    with pytest.raises(common.ExerciseFailed, match="whole number of steps"):
        ex.check_gossip_steps(lambda W, eps: 2.5)


def test_the_answers_are_what_gossip_does_on_the_worst_start():
    # the reference against the definition: the worst start (the eigenvector of the largest
    # |eigenvalue| off the consensus direction) is within eps at t steps and not at t - 1
    for graph in dec.GRAPHS.values():
        W = dec.mixing_matrix(graph)
        (t,) = ex.steps_to_agree(W, 1e-6)
        if t is None:  # the disconnected graph: its two parts keep their own means
            assert dec.spectral_gap(W) < 1e-9
            continue
        if t == 1:  # the complete graph: one step averages exactly
            assert torch.linalg.matrix_norm(W - 1.0 / len(W), ord=2) < 1e-12
            continue
        values, vectors = torch.linalg.eigh(W - 1.0 / len(W))
        x = vectors[:, values.abs().argmax()]
        off = [(torch.linalg.matrix_power(W, s) @ x - (torch.linalg.matrix_power(W, s) @ x).mean())
               .norm().item() / (x - x.mean()).norm().item() for s in (t - 1, t)]
        assert off[1] <= 1e-6 * (1 + 1e-9) and off[0] > 1e-6


def test_gossip_judges_hidden_matrices_only_in_a_graded_run_and_the_student_edition_by_digest(
        monkeypatch):
    visible = [c["W"] for c in ex._matrices(None)["visible"]]

    def right_on_visible_only(W, eps):
        return gossip_steps(W, eps) if any(W.shape == v.shape and torch.equal(W, v)
                                           for v in visible) else None

    assert "correct" in ex.check_gossip_steps(right_on_visible_only)
    with monkeypatch.context() as m:
        m.setenv(common.HIDDEN_SEED, "12345")
        with pytest.raises(common.HiddenTestFailed):
            ex.check_gossip_steps(right_on_visible_only)
        assert "correct" in ex.check_gossip_steps(gossip_steps)

    def stripped(*args):
        raise NotImplementedError("not in the student edition: the grader has it")

    monkeypatch.setattr(ex, "steps_to_agree", stripped)  # as the student edition has it
    assert ex.check_gossip_steps(gossip_steps).startswith("correct for the visible matrices")
    with pytest.raises(common.ExerciseFailed, match="steps: 1 is not right"):
        ex.check_gossip_steps(second_largest)
