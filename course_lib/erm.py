"""Empirical risk minimisation, and accelerated gradient descent on one process.

Lecture note "Parallel computing for empirical risk minimization", section 1:
min_w (1/n) sum_j L(w; x_j, y_j) + R(w), with least squares and l2-regularised logistic
regression as the examples, and accelerated gradient descent v <- beta v + g(w), w <- w - alpha v.
The gradient is a sum over samples: that is what lets section 2 split it over workers.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

KINDS = ("logistic", "least_squares")


@dataclass
class ERMProblem:
    """Data X (n x d), targets y, l2 weight ``lam``; ``kind`` is "logistic" (y in {-1, +1}) or
    "least_squares"."""

    X: torch.Tensor
    y: torch.Tensor
    lam: float
    kind: str
    name: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind {self.kind!r}: use one of {KINDS}")
        X, y = self.X, self.y
        if not (isinstance(X, torch.Tensor) and isinstance(y, torch.Tensor)):
            raise ValueError(f"X and y must be torch tensors (torch.from_numpy makes them of "
                             f"arrays), got {type(X).__name__} and {type(y).__name__}")
        if X.dim() != 2 or y.dim() != 1:
            raise ValueError(f"X must be n x d and y a vector of n targets (not a column), got "
                             f"shapes {tuple(X.shape)} and {tuple(y.shape)}")
        if X.shape[0] != y.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]}")
        if not len(X):
            raise ValueError("X and y have no rows: a mean over no samples is undefined")
        if not X.is_floating_point() or y.dtype != X.dtype:
            raise ValueError(f"X and y must be floating point, of one dtype, got {X.dtype} and "
                             f"{y.dtype}")
        if self.kind == "logistic" and not ((y == 1) | (y == -1)).all():
            raise ValueError(f"logistic regression takes labels y in {{-1, +1}}, got values "
                             f"{sorted(set(y.unique().tolist()))[:6]} (0/1 labels: 2 y - 1)")
        if isinstance(self.lam, bool) or not (isinstance(self.lam, numbers.Real)
                                              and 0 <= self.lam < math.inf):
            raise ValueError(f"lam, the l2 weight, must be a number >= 0, got {self.lam!r}")

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d(self) -> int:
        return self.X.shape[1]

    def loss(self, w) -> float:
        """(1/n) sum_j L(w; x_j, y_j) + (lam/2) ||w||^2."""
        margin = self.X @ w
        if self.kind == "logistic":
            data = torch.nn.functional.softplus(-self.y * margin).mean()
        else:
            data = 0.5 * ((margin - self.y) ** 2).mean()
        return (data + 0.5 * self.lam * w @ w).item()

    def gradient_sum(self, w, rows=None):
        """sum over the rows j of grad L(w; x_j, y_j): a worker's local gradient g~_k, not yet
        divided by n and without the regulariser."""
        X, y = (self.X, self.y) if rows is None else (self.X[rows], self.y[rows])
        margin = X @ w
        if self.kind == "logistic":
            return X.T @ (-y * torch.sigmoid(-y * margin))
        return X.T @ (margin - y)

    def gradient(self, w):
        """g(w) = (1/n) sum_k g~_k(w) + dR/dw."""
        return self.gradient_sum(w) / self.n + self.lam * w

    def __setattr__(self, name, value):
        if name == "X":  # a new X: its norm must be computed again
            self.__dict__.pop("_norm_of_X", None)
        super().__setattr__(name, value)

    def smoothness(self) -> float:
        """An upper bound L on the gradient's Lipschitz constant; alpha = 1/L is a safe step.

        ||X||_2 (an SVD: seconds for the shifted digits) is computed once and kept with the
        problem, so workers that receive a problem after its first call don't each compute it
        again. Assigning a new X forgets it (changing X in place does not: don't)."""
        if "_norm_of_X" not in self.__dict__:
            self.__dict__["_norm_of_X"] = torch.linalg.matrix_norm(self.X, ord=2).item()
        top = self.__dict__["_norm_of_X"] ** 2 / self.n
        return (top / 4 if self.kind == "logistic" else top) + self.lam


def _standardise(X):
    std = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(std > 0, std, 1.0)


def _with_intercept(X):
    return np.hstack([X, np.ones((X.shape[0], 1))])


def breast_cancer_problem(lam: float = 1e-3) -> ERMProblem:
    """Logistic regression on scikit-learn's breast cancer data: n = 569, d = 31 (with an
    intercept). Small d: communication dominates a parallel step."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    X = _with_intercept(_standardise(data.data))
    y = np.where(data.target == 1, 1.0, -1.0)
    return ERMProblem(torch.from_numpy(X), torch.from_numpy(y), lam, "logistic",
                      "breast cancer, logistic")


def diabetes_problem(lam: float = 1e-3) -> ERMProblem:
    """Least squares on scikit-learn's diabetes data: n = 442, d = 11 (with an intercept)."""
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    X = _with_intercept(_standardise(data.data))
    y = (data.target - data.target.mean()) / data.target.std()
    return ERMProblem(torch.from_numpy(X), torch.from_numpy(y), lam, "least_squares",
                      "diabetes, least squares")


def shifted_digits(images, labels):
    """The images and their copies moved by one pixel up, down, left and right (a standard
    augmentation: a digit moved by a pixel is still the same digit). Five times the data."""
    copies = [images]
    for axis, step in ((1, 1), (1, -1), (2, 1), (2, -1)):
        moved = np.roll(images, step, axis=axis)
        edge = [slice(None)] * 3
        edge[axis] = 0 if step == 1 else -1
        moved[tuple(edge)] = 0.0  # what rolled over the border is blank, not wrapped
        copies.append(moved)
    return np.concatenate(copies), np.tile(labels, len(copies))


def digits_quadratic_problem(lam: float = 1e-3, shifted: bool = False) -> ERMProblem:
    """Logistic regression "even vs odd digit" on the bundled digits with all pairwise products
    of pixels as features: n = 1797, d = 1953 (with an intercept); with ``shifted`` also the
    one-pixel shifts of every image, n = 8985. Large n d: computation dominates a parallel
    step."""
    from sklearn.datasets import load_digits
    from sklearn.preprocessing import PolynomialFeatures

    data = load_digits()
    images, labels = data.images, data.target
    if shifted:
        images, labels = shifted_digits(images, labels)
    keep = data.data.std(axis=0) > 0  # drop the pixels that are blank in every original digit
    pixels = images.reshape(len(images), -1)[:, keep] / 16.0
    X = PolynomialFeatures(degree=2, include_bias=False).fit_transform(pixels)
    X = _with_intercept(_standardise(X))
    y = np.where(labels % 2 == 0, 1.0, -1.0)
    name = "shifted digits" if shifted else "digits"
    return ERMProblem(torch.from_numpy(X), torch.from_numpy(y), lam, "logistic",
                      f"{name} quadratic features, logistic")


def agd(problem: ERMProblem, alpha: float, beta: float, iterations: int, w0=None):
    """Accelerated (momentum) gradient descent, sequentially: v <- beta v + g(w), w <- w - alpha v.

    Returns the iterates w_0, ..., w_T as a (T+1) x d tensor.
    """
    if isinstance(iterations, bool) or not (isinstance(iterations, numbers.Integral)
                                            and iterations >= 0):
        raise ValueError(f"iterations must be a whole number >= 0, got {iterations!r}")
    w = torch.zeros(problem.d, dtype=problem.X.dtype) if w0 is None else w0.clone()
    v = torch.zeros_like(w)
    iterates = [w.clone()]
    for _ in range(iterations):
        v = beta * v + problem.gradient(w)
        w = w - alpha * v
        iterates.append(w.clone())
    return torch.stack(iterates)
