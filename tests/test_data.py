"""Datasets (course_lib.data): the bundled digits, and optional MNIST failing clearly."""

import sys
import types
import urllib.error

import pytest
import torch

from course_lib import data


def test_digits_split_shapes_and_types():
    split = data.load_digits()
    assert split.x_train.shape == (1347, 64) and split.x_test.shape == (450, 64)
    assert split.x_train.dtype == torch.float32 and split.y_train.dtype == torch.int64
    assert split.num_classes == 10 and set(split.y_train.tolist()) == set(range(10))
    assert "digits" in repr(split)


def test_digits_are_normalised_with_training_statistics():
    split = data.load_digits(dtype=torch.float64)
    assert abs(split.x_train.mean().item()) < 1e-9
    assert abs(split.x_train.std().item() - 1) < 1e-9


def test_digits_are_deterministic_for_a_seed_and_differ_across_seeds():
    a, b, c = data.load_digits(seed=3), data.load_digits(seed=3), data.load_digits(seed=4)
    torch.testing.assert_close(a.x_train, b.x_train)
    assert torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.y_test, c.y_test)


def test_digits_split_is_stratified():
    split = data.load_digits(test_fraction=0.5)
    counts = torch.bincount(split.y_test, minlength=10)
    assert counts.min() >= 85  # about 180 of each digit, half of them in the test set


def test_digits_as_images():
    split = data.load_digits(images=True)
    assert split.x_train.shape[1:] == (1, 8, 8)


def test_bad_test_fraction_dtype_or_text_length():
    with pytest.raises(ValueError, match="test_fraction"):
        data.load_digits(test_fraction=1.5)
    with pytest.raises(ValueError, match="dtype must be a floating-point dtype"):
        data.load_digits(dtype=torch.int64)
    assert data.load_digits(dtype=torch.float64).x_train.dtype == torch.float64
    for bad in (-5, 0, True, 2.5):
        with pytest.raises(ValueError, match="max_chars must be a whole number of at least 1"):
            data.stdlib_text(bad)


def test_mnist_without_torchvision_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import fails
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)
    with pytest.raises(data.DatasetUnavailable, match="pip install torchvision"):
        data.load_mnist()


def _fake_torchvision(monkeypatch, dataset_class):
    tv = types.ModuleType("torchvision")
    tv.datasets = types.ModuleType("torchvision.datasets")
    tv.datasets.MNIST = tv.datasets.FashionMNIST = dataset_class
    monkeypatch.setitem(sys.modules, "torchvision", tv)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", tv.datasets)


def test_mnist_not_downloaded_says_how_to_get_it(monkeypatch, tmp_path):
    def missing(root, train, download):
        raise RuntimeError("Dataset not found. You can use download=True to download it")
    _fake_torchvision(monkeypatch, missing)
    with pytest.raises(data.DatasetUnavailable, match="download=True"):
        data.load_mnist(root=tmp_path)


def test_mnist_offline_download_says_so(monkeypatch, tmp_path):
    def offline(root, train, download):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
    _fake_torchvision(monkeypatch, offline)
    with pytest.raises(data.DatasetUnavailable, match="offline"):
        data.load_mnist("fashion-mnist", root=tmp_path, download=True)


def test_mnist_from_files_is_normalised_and_limited(monkeypatch, tmp_path):
    def present(root, train, download):
        n = 50 if train else 20
        return types.SimpleNamespace(data=torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8),
                                     targets=torch.arange(n) % 10)
    _fake_torchvision(monkeypatch, present)
    split = data.load_mnist(root=tmp_path, limit=30, images=True)
    assert split.x_train.shape == (30, 1, 28, 28) and split.x_test.shape == (20, 1, 28, 28)
    assert abs(split.x_train.mean().item()) < 1e-5
    for limit in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="limit must be a whole number of at least 1"):
            data.load_mnist(root=tmp_path, limit=limit)


def test_unknown_dataset_name():
    with pytest.raises(ValueError, match="unknown dataset"):
        data.load_mnist("cifar")


def test_shard_rows_cover_every_row_once_in_near_equal_shards():
    contiguous = data.shard_rows(10, 3)
    assert [len(p) for p in contiguous] == [4, 3, 3]
    assert torch.equal(torch.cat(contiguous), torch.arange(10))  # no seed: blocks in order
    shuffled = data.shard_rows(100, 3, seed=1)
    assert sorted(torch.cat(shuffled).tolist()) == list(range(100))
    assert [len(s) for s in shuffled] == [34, 33, 33]
    assert not torch.equal(torch.cat(shuffled), torch.arange(100))
    assert all(torch.equal(a, b) for a, b in zip(shuffled, data.shard_rows(100, 3, seed=1),
                                                 strict=True))
    for n, p in ((5, 6), (10, 2.5), (10, True)):
        with pytest.raises(ValueError, match="need whole numbers 1 <= p <= n"):
            data.shard_rows(n, p)


def test_batch_rows_are_reproducible_and_drawn_from_the_shard():
    shard = data.shard_rows(100, 3, seed=1)[0]
    b = data.batch_rows(shard, 8, seed=1, worker=1, step=5)
    assert torch.equal(b, data.batch_rows(shard, 8, seed=1, worker=1, step=5))
    assert not torch.equal(b, data.batch_rows(shard, 8, seed=1, worker=1, step=6))
    assert set(b.tolist()) <= set(shard.tolist()) and len(set(b.tolist())) == 8
    assert sorted(data.batch_rows(shard, len(shard), 1, 1, 0).tolist()) == sorted(shard.tolist())
    for bad in (0, -1, 2.0):  # -1 would take all rows but one, 0 would give a NaN mean
        with pytest.raises(ValueError, match="batch must be a whole number of at least 1"):
            data.batch_rows(shard, bad, seed=1, worker=1, step=0)
    assert sorted(data.batch_rows(shard, 35, 1, 1, 0).tolist()) == sorted(shard.tolist())


def test_every_seed_worker_and_step_draws_its_own_batch():
    assert data.batch_key(2, 3, 5) == 2 * 1_000_003 + 3 * 10_007 + 5  # the course's runs
    # the sum alone would give worker 0's step 10,007 worker 1's step 0, and seed 1 of worker 0
    # step 697 seed 0's worker 100
    for a, b in (((0, 0, 10_007), (0, 1, 0)), ((1, 0, 697), (0, 100, 0)),
                 ((0, 0, 20_014), (0, 2, 0)), ((0, -1, 5), (0, 0, 5 - 10_007))):
        assert data.batch_key(*a) != data.batch_key(*b)
    keys = {data.batch_key(s, w, t) for s in range(3) for w in range(0, 300, 7)
            for t in range(0, 30_000, 997)}
    assert len(keys) == 3 * len(range(0, 300, 7)) * len(range(0, 30_000, 997))
    shard = torch.arange(1000)
    assert not torch.equal(data.batch_rows(shard, 20, 0, 0, 10_007),
                           data.batch_rows(shard, 20, 0, 1, 0))
    with pytest.raises(TypeError):
        data.batch_key(0, 0, 2.5)


def test_text_batches_are_next_token_windows_and_impossible_ones_are_refused():
    tokens = torch.arange(10)
    x, y = data.text_batch(tokens, 3, 8, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (3, 8) and torch.equal(y, x + 1)  # each target one step ahead
    starts = data.text_batch(tokens, 200, 8, torch.Generator().manual_seed(0))[0][:, 0]
    assert set(starts.tolist()) == {0, 1}  # both windows of 9 tokens in 10, the last one too
    x, y = data.text_batch(tokens, 2, 9)  # the one window: every token
    assert torch.equal(x[0], tokens[:9]) and torch.equal(y[1], tokens[1:])
    with pytest.raises(ValueError, match="10 tokens hold no window of context 10"):
        data.text_batch(tokens, 3, 10)
    for batch, context in ((0, 4), (2, 0), (-1, 4)):
        with pytest.raises(ValueError, match="must be a whole number of at least 1"):
            data.text_batch(tokens, batch, context)


def test_batch_rows_refuses_an_empty_shard_rather_than_an_empty_batch():
    with pytest.raises(ValueError, match="worker 3's shard has no rows"):
        data.batch_rows(torch.arange(0), 8, seed=0, worker=3, step=0)


def test_any_whole_seed_draws_a_batch():
    shard = torch.arange(10)
    for seed in (2**64, -2**62, -1, 2**40):  # beyond what torch's generator takes as it is
        rows = data.batch_rows(shard, 4, seed, 0, 0)
        assert len(set(rows.tolist())) == 4
        torch.testing.assert_close(rows, data.batch_rows(shard, 4, seed, 0, 0))
    assert data.batch_key(5, 1, 2) == 5 * 1_000_003 + 10_007 + 2  # the usual seeds as before


def test_any_whole_seed_shards_the_rows():
    for seed in (2**64, -2**62, -1):  # beyond what torch's generator takes as it is
        shards = data.shard_rows(10, 2, seed=seed)
        assert sorted(torch.cat(shards).tolist()) == list(range(10))
        assert [s.tolist() for s in shards] == [s.tolist() for s in data.shard_rows(10, 2, seed)]
    assert [s.tolist() for s in data.shard_rows(10, 2, seed=3)] == [  # the usual seeds as before
        s.tolist() for s in torch.randperm(10, generator=torch.Generator().manual_seed(3)).chunk(2)]
