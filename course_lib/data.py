"""Datasets for the lessons: the handwritten digits that ship with scikit-learn, offline.

Lecture: "Parallel computing for empirical risk minimization", section 1 (n samples x_j, y_j to
minimise the empirical risk over) and section 2 (the samples partitioned over the workers:
:func:`shard_rows`). Every default path of the course uses :func:`load_digits`, which needs no
network. MNIST and Fashion-MNIST are optional, through torchvision, cached under ``data/`` and
never downloaded unless asked for.
"""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from course_lib.training import check_whole, is_whole

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


class DatasetUnavailable(RuntimeError):
    """An optional dataset can't be loaded here; the message says what to do instead."""


@dataclass
class Split:
    """A train/test split as float features and integer labels."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    name: str

    def __repr__(self):
        return (f"Split({self.name}: train {tuple(self.x_train.shape)}, "
                f"test {tuple(self.x_test.shape)}, {self.num_classes} classes)")


def _normalise(x_train, x_test):
    # statistics of the training set only: the test set must not leak into training
    mean, std = x_train.mean(), x_train.std()
    return (x_train - mean) / std, (x_test - mean) / std


def load_digits(seed: int = 0, test_fraction: float = 0.25, images: bool = False,
                dtype: torch.dtype = torch.float32) -> Split:
    """The 1,797 8x8 handwritten digits bundled with scikit-learn, split and normalised.

    Features are standardised with the training set's mean and standard deviation. ``images``
    gives tensors of shape (n, 1, 8, 8) for convolutions instead of (n, 64). The split is
    stratified by label and the same for the same ``seed``.
    """
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating-point dtype (the features are standardised), "
                         f"got {dtype}")
    bunch = sklearn_digits()
    x = bunch.data.astype(np.float64) / 16.0
    y = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, stratify=y,
                                              random_state=seed)
    x_tr, x_te = _normalise(torch.from_numpy(x_tr), torch.from_numpy(x_te))
    if images:
        x_tr, x_te = x_tr.reshape(-1, 1, 8, 8), x_te.reshape(-1, 1, 8, 8)
    return Split(x_tr.to(dtype), torch.from_numpy(y_tr), x_te.to(dtype), torch.from_numpy(y_te),
                 num_classes=10, name="digits")


def stdlib_text(max_chars: int = 400_000) -> torch.Tensor:
    """Characters of Python's own standard library source (files every Python installation
    ships: lesson 10's language model needs text and the course downloads nothing), as tokens.

    The modules are read in sorted order until ``max_chars``. Token 0 is the newline, 1-95 are
    printable ASCII (32-126); a tab or other control character becomes a space and a
    non-ASCII character a question mark.
    Deterministic on one Python version; other versions ship other files.
    """
    import sysconfig

    check_whole("max_chars", max_chars)
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    if not files:
        raise DatasetUnavailable(f"no Python source files under {root}: this Python ships its "
                                 f"standard library compiled only; pass another text")
    chunks, size = [], 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace").replace("\t", " ")
        chunks.append(text)
        size += len(text)
        if size >= max_chars:
            break
    codes = torch.frombuffer(bytearray("".join(chunks)[:max_chars].encode("ascii", "replace")),
                             dtype=torch.uint8).long()
    tokens = torch.where((codes >= 32) & (codes <= 126), codes - 31, 1)  # other: a space
    tokens[codes == 10] = 0
    return tokens  # values 0..95: a vocabulary of 96


def text_batch(tokens: torch.Tensor, batch: int, context: int, generator=None):
    """``batch`` random windows of ``context`` tokens and, for each, the tokens one step ahead
    (what a language model learns to predict)."""
    check_whole("batch", batch), check_whole("context", context)
    if len(tokens) < context + 1:
        raise ValueError(f"{len(tokens)} tokens hold no window of context {context} and its next "
                         f"token to draw from; choose a context under {len(tokens)}")
    # a window and its next token span context + 1 tokens: it may start at 0 .. len - context - 1
    starts = torch.randint(0, len(tokens) - context, (batch,), generator=generator)
    windows = torch.stack([tokens[s:s + context + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def shard_rows(n: int, p: int, seed: int | None = None) -> list[torch.Tensor]:
    """Rows 0..n-1 cut into p shards whose sizes differ by at most one, one per worker
    (data parallelism: the lecture note's "n samples partitioned over m workers").

    ``seed=None`` keeps the rows in order (contiguous blocks); a seed shuffles them first, so
    every shard holds the same kind of data (IID) -- and the same seed gives the same shards.
    """
    if not all(map(is_whole, (n, p))) or not 1 <= p <= n:
        raise ValueError(f"need whole numbers 1 <= p <= n to give every worker rows, got p={p!r}, "
                         f"n={n!r}")
    if seed is not None and not is_whole(seed):
        raise ValueError(f"seed must be None (rows in order) or a whole number, got {seed!r}")
    seed = seed if seed is None or 0 <= seed < 2**63 else batch_key(seed, 99, 0)  # in range
    order = (torch.arange(n) if seed is None
             else torch.randperm(n, generator=torch.Generator().manual_seed(seed)))
    return list(order.tensor_split(p))


def batch_rows(shard: torch.Tensor, batch: int, seed: int, worker: int, step: int):
    """The rows of worker ``worker``'s ``step``-th mini-batch: ``batch`` rows of its shard drawn
    without replacement. Seeded by (seed, worker, step), so a real run, a simulator and a
    sequential reference all draw the same batches. A batch larger than the shard is the whole
    shard (as a DataLoader's last batch is what is left); one of 0 rows or fewer is refused."""
    check_whole("batch", batch)
    if not len(shard):
        raise ValueError(f"worker {worker}'s shard has no rows: there is no batch to draw")
    g = torch.Generator().manual_seed(batch_key(seed, worker, step))
    return shard[torch.randperm(len(shard), generator=g)[:batch].to(shard.device)]


def batch_key(seed: int, worker: int, step: int) -> int:
    """The generator seed of (seed, worker, step). For a seed from 0 below 2**40, below 99 workers
    and 10,007 steps it is ``seed * 1_000_003 + worker * 10_007 + step``, a different one for
    each triple; beyond, that sum would repeat another triple's (worker 0's step 10,007 is worker
    1's step 0) or leave the generator's range, so a 56-bit hash of the three numbers is used
    instead (a repeat as unlikely as two random 56-bit numbers meeting)."""
    seed, worker, step = (operator.index(v) for v in (seed, worker, step))  # whole numbers only
    if 0 <= seed < 2**40 and 0 <= worker < 99 and 0 <= step < 10_007:  # a seed torch takes
        return seed * 1_000_003 + worker * 10_007 + step
    digest = hashlib.blake2b(f"{seed},{worker},{step}".encode(), digest_size=7).digest()
    return 2**62 + int.from_bytes(digest, "big")  # above every sum the formula gives in practice


_TORCHVISION = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}


def load_mnist(name: str = "mnist", root: str | Path = DATA_DIR, download: bool = False,
               images: bool = False, limit: int | None = None,
               dtype: torch.dtype = torch.float32) -> Split:
    """MNIST or Fashion-MNIST (60,000 train / 10,000 test 28x28 images) through torchvision.

    Looks for the files under ``root`` (``data/`` by default); downloads them only with
    ``download=True``. ``limit`` keeps the first ``limit`` training and test examples.
    Raises :class:`DatasetUnavailable` with what to do when torchvision is missing, the files are
    not there, or the download fails (offline).
    """
    if name not in _TORCHVISION:
        raise ValueError(f"unknown dataset {name!r}: use one of {sorted(_TORCHVISION)}")
    if limit is not None:
        check_whole("limit", limit)
    try:
        import torchvision.datasets
    except ImportError as err:
        raise DatasetUnavailable(
            f"{name} needs torchvision, which is not installed ({err}). Install the torchvision "
            f"release that matches your torch (pip install torchvision), or use "
            f"course_lib.data.load_digits(), which ships with scikit-learn.") from None
    cls = getattr(torchvision.datasets, _TORCHVISION[name])
    try:
        parts = [cls(str(root), train=train, download=download) for train in (True, False)]
    except RuntimeError as err:  # torchvision: "Dataset not found. You can use download=True"
        raise DatasetUnavailable(
            f"{name} is not under {root} ({err}). Call load_mnist({name!r}, download=True) once "
            f"while online, or copy the files there; offline, use load_digits().") from None
    except OSError as err:  # URLError, socket errors: no network
        raise DatasetUnavailable(
            f"could not download {name} into {root}: {err}. This machine looks offline: copy "
            f"the files there from a machine that is online, or use load_digits().") from None
    tensors = []
    for part in parts:
        x = part.data[:limit].to(torch.float64) / 255.0
        tensors.append((x, part.targets[:limit].to(torch.int64)))
    (x_tr, y_tr), (x_te, y_te) = tensors
    x_tr, x_te = _normalise(x_tr, x_te)
    shape = (-1, 1, 28, 28) if images else (-1, 28 * 28)
    return Split(x_tr.reshape(shape).to(dtype), y_tr, x_te.reshape(shape).to(dtype), y_te,
                 num_classes=10, name=name)
