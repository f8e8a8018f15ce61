"""ERM problems and sequential AGD (course_lib.erm)."""

import numpy as np
import pytest
import torch

from course_lib import erm
from course_lib.data import shard_rows


@pytest.fixture(scope="module")
def problems():
    return [erm.breast_cancer_problem(), erm.diabetes_problem()]


def test_problems_ship_with_scikit_learn_and_have_the_documented_shapes(problems):
    cancer, diabetes = problems
    assert (cancer.n, cancer.d) == (569, 31) and set(cancer.y.tolist()) == {-1.0, 1.0}
    assert (diabetes.n, diabetes.d) == (442, 11)
    quad = erm.digits_quadratic_problem()
    assert (quad.n, quad.d) == (1797, 1953)


@pytest.mark.parametrize("index", [0, 1])
def test_gradient_equals_autograd_of_the_loss(problems, index):
    problem = problems[index]
    w = torch.randn(problem.d, dtype=torch.float64, requires_grad=True)
    margin = problem.X @ w
    if problem.kind == "logistic":
        loss = torch.nn.functional.softplus(-problem.y * margin).mean()
    else:
        loss = 0.5 * ((margin - problem.y) ** 2).mean()
    (loss + 0.5 * problem.lam * w @ w).backward()
    torch.testing.assert_close(problem.gradient(w.detach()), w.grad)
    assert problem.loss(w.detach()) == pytest.approx((loss + 0.5 * problem.lam * w @ w).item())


def test_local_gradient_sums_add_up_to_the_full_gradient(problems):
    problem = problems[0]
    w = torch.randn(problem.d, dtype=torch.float64)
    parts = shard_rows(problem.n, 3)
    total = sum(problem.gradient_sum(w, rows) for rows in parts)
    torch.testing.assert_close(total / problem.n + problem.lam * w, problem.gradient(w))


@pytest.mark.parametrize("index", [0, 1])
def test_agd_with_step_one_over_L_decreases_the_loss(problems, index):
    problem = problems[index]
    iterates = erm.agd(problem, 1 / problem.smoothness(), 0.9, 50)
    assert iterates.shape == (51, problem.d)
    assert problem.loss(iterates[-1]) < 0.5 * problem.loss(iterates[0])


def test_smoothness_bounds_the_curvature(problems):
    problem = problems[1]  # least squares: the Hessian is X^T X / n + lam I
    hessian = problem.X.T @ problem.X / problem.n + problem.lam * torch.eye(problem.d,
                                                                            dtype=torch.float64)
    assert torch.linalg.eigvalsh(hessian).max().item() <= problem.smoothness() + 1e-9


def test_smoothness_computes_the_norm_of_X_once_and_sends_it_with_the_problem(problems,
                                                                             monkeypatch):
    import pickle

    problem = erm.ERMProblem(problems[1].X.clone(), problems[1].y, problems[1].lam,
                             "least_squares")
    calls = []
    norm = torch.linalg.matrix_norm
    monkeypatch.setattr(torch.linalg, "matrix_norm",
                        lambda *a, **k: calls.append(1) or norm(*a, **k))
    first = problem.smoothness()
    copy = pickle.loads(pickle.dumps(problem))  # what a worker receives
    assert copy.smoothness() == problem.smoothness() == first and len(calls) == 1
    copy.X = 2 * copy.X  # a new X: a new norm, four times the curvature of the data term
    assert copy.smoothness() - copy.lam == pytest.approx(4 * (first - copy.lam))
    assert len(calls) == 2


def test_bad_problem_definitions():
    X = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="unknown kind"):
        erm.ERMProblem(X, torch.zeros(3), 0.0, "hinge")
    with pytest.raises(ValueError, match="rows"):
        erm.ERMProblem(X, torch.zeros(4), 0.0, "logistic")


def test_shifted_digits_move_every_image_by_one_pixel_without_wrapping():
    images = np.zeros((1, 8, 8))
    images[0, 0, 7] = 1.0  # top-right corner
    shifted, labels = erm.shifted_digits(images, np.array([3]))
    assert shifted.shape == (5, 8, 8) and labels.tolist() == [3] * 5
    assert shifted[1, 1, 7].item() == pytest.approx(1.0)  # moved down
    # moved up, over the border: gone, not wrapped
    assert np.abs(shifted[2]).sum() == pytest.approx(0.0)
    assert shifted[4, 0, 6].item() == pytest.approx(1.0)  # moved left


def test_shifted_quadratic_problem_has_five_times_the_rows():
    assert erm.digits_quadratic_problem(shifted=True).n == 5 * 1797


def _bad(**change):
    X, y = torch.randn(5, 2, dtype=torch.float64), torch.tensor([1.0, -1, 1, -1, 1],
                                                                 dtype=torch.float64)
    args = dict(X=X, y=y, lam=0.1, kind="logistic") | change
    return args


@pytest.mark.parametrize("change, message", [
    (dict(y=torch.ones(5, 1, dtype=torch.float64)), "not a column"),  # was an n x n loss
    (dict(X=torch.ones(5, dtype=torch.float64)), "X must be n x d"),  # was an IndexError later
    (dict(y=torch.tensor([0.0, 1, 0, 1, 1], dtype=torch.float64)), r"labels y in \{-1, \+1\}"),
    (dict(lam=-0.1), "lam, the l2 weight, must be a number >= 0"),
    (dict(lam=float("nan")), "lam, the l2 weight, must be a number >= 0"),
    (dict(X=np.ones((5, 2))), "X and y must be torch tensors"),
    (dict(y=np.ones(5)), "X and y must be torch tensors"),
    (dict(X=torch.ones(5, 2)), "floating point, of one dtype, got torch.float32 and"),
    (dict(X=torch.ones(5, 2, dtype=torch.long)), "floating point"),
    (dict(X=torch.ones(0, 2, dtype=torch.float64), y=torch.ones(0, dtype=torch.float64)),
     "no rows")])
def test_a_problem_that_would_compute_something_wrong_later_is_refused_when_made(change,
                                                                                 message):
    with pytest.raises(ValueError, match=message):
        erm.ERMProblem(**_bad(**change))


def test_least_squares_takes_any_real_targets_and_a_numpy_lam():
    args = _bad(kind="least_squares", y=torch.linspace(0, 3, 5, dtype=torch.float64),
                lam=np.float64(0.0))
    assert erm.ERMProblem(**args).loss(torch.zeros(2, dtype=torch.float64)) > 0


@pytest.mark.parametrize("iterations", [-3, 2.5, True])
def test_agd_refuses_a_step_count_that_is_no_whole_number_of_at_least_zero(problems,
                                                                            iterations):
    # -3 used to return w0 alone
    with pytest.raises(ValueError, match="iterations must be a whole number >= 0"):
        erm.agd(problems[1], 0.1, 0.9, iterations)
    assert erm.agd(problems[1], 0.1, 0.9, np.int64(2)).shape == (3, problems[1].d)
