"""Partitions of the digits over federated clients (course_lib.partitions)."""

import numpy as np
import pytest
import torch

from course_lib import partitions as pt
from course_lib.data import load_digits


@pytest.fixture(scope="module")
def labels():
    return load_digits().y_train.numpy()


SCHEMES = {
    "iid": lambda y, seed: pt.iid(y, 20, seed=seed),
    "label_shards": lambda y, seed: pt.label_shards(y, 20, seed=seed),
    "k_classes": lambda y, seed: pt.k_classes(y, 20, k=3, seed=seed),
    "dirichlet_per_class": lambda y, seed: pt.dirichlet_per_class(y, 20, alpha=0.5, seed=seed),
    "dirichlet_per_client": lambda y, seed: pt.dirichlet_per_client(y, 20, alpha=0.5, seed=seed),
    "quantity_skew": lambda y, seed: pt.quantity_skew(y, 20, alpha=1.0, seed=seed),
}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_partition_is_disjoint_complete_and_seeded(labels, scheme):
    parts = SCHEMES[scheme](labels, 0)
    assert len(parts) == 20 and all(p.dtype == torch.int64 for p in parts)
    rows = torch.cat(parts)
    assert len(rows) == len(labels) == len(set(rows.tolist()))  # disjoint and complete
    again = SCHEMES[scheme](labels, 0)
    assert all(torch.equal(a, b) for a, b in zip(parts, again, strict=True))
    other = SCHEMES[scheme](labels, 1)
    assert not all(torch.equal(a, b) for a, b in zip(parts, other, strict=True))


def test_iid_and_per_client_dirichlet_sizes_differ_by_at_most_one(labels):
    for parts in (pt.iid(labels, 20), pt.dirichlet_per_client(labels, 20, alpha=0.1)):
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1


def test_label_counts_count_each_clients_labels_and_name_labels_out_of_range():
    labels = np.array([0, 1, 1, 2])
    expected = np.array([[1, 1, 0, 0], [0, 1, 1, 0]])
    for parts in ([torch.tensor([0, 1]), torch.tensor([2, 3])], [[0, 1], [2, 3]]):
        assert (pt.label_counts(labels, parts, num_classes=4) == expected).all()
    assert pt.label_counts(labels, [[0, 1], [2, 3]]).shape == (2, 3)
    for num_classes in (2, 0, True, 2.5):  # a label 2 needs 3 classes or more
        with pytest.raises(pt.PartitionError, match="labels must be classes 0 to num_classes"):
            pt.label_counts(labels, [[0, 1]], num_classes=num_classes)
    with pytest.raises(pt.PartitionError, match="clients must be"):
        pt.iid(labels, True)
    for rows in ([0, 1, 50], [0.5], [-1]):  # 50 used to be a bare IndexError, 0.5 counted as 0
        with pytest.raises(pt.PartitionError, match="client 0's rows must be whole row numbers"):
            pt.label_counts(labels, [rows])
    assert pt.label_counts(labels, [[], [3]]).tolist() == [[0, 0, 0], [0, 0, 1]]


@pytest.mark.parametrize("call, name", [
    (lambda y: pt.label_shards(y, 4, shards_per_client=2.5), "shards_per_client"),
    (lambda y: pt.k_classes(y, 4, k=2.5), "k"),
    (lambda y: pt.quantity_skew(y, 4, min_size=-100), "min_size"),  # it gave empty clients
    (lambda y: pt.dirichlet_per_class(y, 4, alpha=1.0, min_size=True), "min_size")])
def test_counts_that_are_no_whole_numbers_are_refused_by_name(call, name):
    with pytest.raises(pt.PartitionError, match=f"{name} must be a whole number of at least"):
        call(np.repeat(np.arange(4), 10))


def test_label_shards_give_each_client_at_most_two_labels(labels):
    parts = pt.label_shards(labels, 20, shards_per_client=2)
    counts = pt.label_counts(labels, parts)
    assert ((counts > 0).sum(axis=1) <= 2).all()
    assert ((counts > 0).sum(axis=1) == 2).mean() > 0.8  # two different classes, mostly
    with pytest.raises(pt.PartitionError, match="cannot cover"):
        pt.label_shards(labels, 4, shards_per_client=2)


def test_k_classes_gives_each_client_exactly_k_labels_and_every_class_an_owner(labels):
    counts = pt.label_counts(labels, pt.k_classes(labels, 20, k=3))
    assert ((counts > 0).sum(axis=1) == 3).all()
    assert (counts.sum(axis=0) > 0).all()
    with pytest.raises(pt.PartitionError, match="without an owner"):
        pt.k_classes(labels, 3, k=2)


def test_dirichlet_per_class_respects_min_size_and_fails_clearly(labels):
    parts = pt.dirichlet_per_class(labels, 20, alpha=0.3, min_size=15)
    assert min(len(p) for p in parts) >= 15
    with pytest.raises(pt.PartitionError, match="raise alpha"):
        pt.dirichlet_per_class(labels, 60, alpha=0.01, min_size=20, retries=5)
    with pytest.raises(pt.PartitionError, match="positive"):
        pt.dirichlet_per_class(labels, 20, alpha=0)


def test_smaller_alpha_means_more_skew_in_both_dirichlet_conventions(labels):
    for draw in (pt.dirichlet_per_class, pt.dirichlet_per_client):
        skew = {a: pt.earth_movers_distance(pt.label_counts(labels, draw(labels, 20, alpha=a)))
                .mean() for a in (0.1, 100.0)}
        assert skew[0.1] > 3 * skew[100.0]


def test_quantity_skew_varies_sizes_not_label_mixes(labels):
    parts = pt.quantity_skew(labels, 20, alpha=0.5, min_size=5)
    sizes = [len(p) for p in parts]
    assert min(sizes) >= 5 and max(sizes) > 4 * min(sizes)
    big = [p for p in parts if len(p) > 100]
    assert pt.earth_movers_distance(pt.label_counts(labels, big)).max() < 0.5


def test_earth_movers_distance_is_zero_for_the_global_mix_and_two_for_disjoint_classes():
    counts = np.array([[5, 5, 0, 0], [0, 0, 5, 5], [5, 5, 5, 5]])
    np.testing.assert_allclose(pt.earth_movers_distance(counts), [1.0, 1.0, 0.0])
    np.testing.assert_allclose(pt.earth_movers_distance(np.array([[4, 0], [0, 4]]))[0], 1.0)
    assert pt.earth_movers_distance(np.array([[9, 0], [0, 1]]))[1] == pytest.approx(1.8)


def test_bad_client_counts_are_rejected(labels):
    for bad in (0, len(labels) + 1, 2.5):
        with pytest.raises(pt.PartitionError, match="clients must be"):
            pt.iid(labels, bad)


@pytest.mark.parametrize("scheme, clients, kw", [("dirichlet_per_class", 5, dict(min_size=1)),
                                                 ("dirichlet_per_client", 20, {})])
def test_skew_grows_as_alpha_falls_over_the_whole_range(labels, scheme, clients, kw):
    alphas = [1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3]
    skew = [np.mean([pt.earth_movers_distance(pt.label_counts(labels, getattr(pt, scheme)(
        labels, clients, alpha=a, seed=seed, **kw))).mean() for seed in range(3)])
        for a in alphas]
    # non-increasing in alpha, with 0.01 of slack where it saturates (one class per client)
    assert all(small >= large - 0.01 for small, large in zip(skew, skew[1:], strict=False)), skew
    assert skew[0] > 1.4 and skew[-1] < 0.4


@pytest.mark.parametrize("scheme", ["dirichlet_per_class", "dirichlet_per_client",
                                    "quantity_skew"])
@pytest.mark.parametrize("alpha", [0, 0.0, -1.0, float("nan"), float("inf"), "1", True])
def test_every_alpha_scheme_refuses_an_invalid_alpha(labels, scheme, alpha):
    with pytest.raises(pt.PartitionError, match="alpha must be a positive, finite number"):
        getattr(pt, scheme)(labels, 10, alpha=alpha)


def test_too_few_classes_for_the_clients_at_tiny_alpha_is_a_clear_error(labels):
    # every class goes to one client: 10 classes cannot give 20 clients a row each
    with pytest.raises(pt.PartitionError, match="fewer than 1 rows"):
        pt.dirichlet_per_class(labels, 20, alpha=1e-3, min_size=1)


def test_dirichlet_split_cuts_every_row_once_in_order():
    rng = np.random.default_rng(0)
    rows = np.arange(100)
    pieces = pt.dirichlet_split(rows, 7, 0.5, rng)
    assert len(pieces) == 7 and np.array_equal(np.concatenate(pieces), rows)
    one = pt.dirichlet_split(rows, 7, 1e-3, np.random.default_rng(1))
    assert max(len(p) for p in one) >= 90  # a tiny alpha: nearly everything in one piece


@pytest.mark.parametrize("scheme", SCHEMES)
def test_one_hot_or_nan_labels_are_refused_by_name(labels, scheme):
    one_hot = np.eye(10)[labels]  # its flat indices would name rows past the end
    with pytest.raises(pt.PartitionError, match=r"one class per row .* shape \(1347, 10\)"):
        SCHEMES[scheme](one_hot, 0)
    with_nan = labels.astype(float)
    with_nan[:5] = np.nan
    with pytest.raises(pt.PartitionError, match="labels must be whole class numbers"):
        SCHEMES[scheme](with_nan, 0)


def test_numpy_numbers_work_as_python_ones(labels):
    for a, b in zip(pt.iid(labels, np.int64(4)), pt.iid(labels, 4), strict=True):
        assert torch.equal(a, b)
    by_numpy = pt.dirichlet_per_class(labels, 4, np.float32(0.5), min_size=1)
    assert sum(len(p) for p in by_numpy) == len(labels)
    counts = pt.label_counts(labels.astype(float), pt.iid(labels, 4), np.int64(10))
    np.testing.assert_array_equal(counts, pt.label_counts(labels, pt.iid(labels, 4), 10))


def test_a_partition_that_would_leave_a_client_empty_is_refused():
    two_classes = np.repeat(np.arange(2), 5)  # 10 rows
    with pytest.raises(pt.PartitionError, match="client 5 gets no rows .* smaller k"):
        pt.k_classes(two_classes, 10, 2)
    with pytest.raises(pt.PartitionError, match="gets no rows .* 20 shards"):
        pt.label_shards(two_classes, 10, 2)


def test_counts_without_rows_or_clients_are_refused():
    with pytest.raises(pt.PartitionError, match="clients x classes matrix"):
        pt.earth_movers_distance(np.zeros((3, 4)))
    with pytest.raises(pt.PartitionError, match="clients x classes matrix"):
        pt.earth_movers_distance(np.array([1, 2]))
    with pytest.raises(pt.PartitionError, match="parts is empty"):
        pt.label_counts(np.arange(4), [])
