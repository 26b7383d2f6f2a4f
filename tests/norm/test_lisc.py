"""LISC equals FINCH's first partition and handles the edge cases without NaN."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dyntta.norm import lisc
from dyntta.norm.lisc import first_neighbours

finch = pytest.importorskip("finch")


def canonical(labels) -> list[int]:
    """Relabel a partition by order of first appearance."""
    seen: dict[int, int] = {}
    return [seen.setdefault(int(v), len(seen)) for v in labels]


def finch_first_partition(x: np.ndarray) -> list[int]:
    c, _, _ = finch.FINCH(x, distance="cosine", verbose=False)
    return canonical(c[:, 0])


def union_find_reference(x: np.ndarray) -> list[int]:
    """Independent reference: first neighbours by a double loop, components by union-find."""
    b = len(x)
    norms = np.linalg.norm(x, axis=1)
    unit = np.where(norms[:, None] > 0, x / np.where(norms > 0, norms, 1)[:, None], 0.0)
    parent = list(range(b))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(b):
        best, best_sim = None, -np.inf
        for j in range(b):
            if j != i and unit[i] @ unit[j] > best_sim:
                best, best_sim = j, unit[i] @ unit[j]
        if best is not None:
            parent[find(i)] = find(best)
    return canonical([find(i) for i in range(b)])


@st.composite
def instance_means(draw):
    """Random (B, C) batches: plain Gaussian, or several well-separated domains with noise."""
    b = draw(st.integers(3, 48))
    c = draw(st.integers(2, 24))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    if draw(st.booleans()):
        return rng.normal(size=(b, c))
    k = draw(st.integers(1, 5))
    centres = rng.normal(size=(k, c)) * 3
    spread = draw(st.sampled_from([0.05, 0.3, 1.0]))
    return centres[rng.integers(0, k, size=b)] + spread * rng.normal(size=(b, c))


def has_near_ties(x: np.ndarray, tol: float = 1e-6) -> bool:
    """Whether some row's two most similar other rows are within ``tol`` in cosine similarity.

    FINCH rounds its distances to float32, which turns such near-ties into exact ties broken by
    the lowest index; LISC compares at the input's precision. Exact ties are not near-ties.
    """
    unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)
    sim = unit @ unit.T
    np.fill_diagonal(sim, -np.inf)
    top2 = np.sort(sim, axis=1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    return bool(((gap > 0) & (gap < tol)).any())


@settings(max_examples=150, deadline=None)
@given(instance_means())
def test_lisc_equals_finch_first_partition(x):
    assume(not has_near_ties(x))
    assert canonical(lisc(torch.from_numpy(x))) == finch_first_partition(x)


@settings(max_examples=60, deadline=None)
@given(instance_means())
def test_lisc_equals_union_find_reference(x):
    assert canonical(lisc(torch.from_numpy(x))) == union_find_reference(x)


@settings(max_examples=60, deadline=None)
@given(instance_means(), st.integers(0, 2**31 - 1))
def test_permuting_the_batch_permutes_the_partition(x, seed):
    perm = np.random.default_rng(seed).permutation(len(x))
    labels = lisc(torch.from_numpy(x)).numpy()
    assert canonical(lisc(torch.from_numpy(x[perm]))) == canonical(labels[perm])


@settings(max_examples=60, deadline=None)
@given(instance_means())
def test_labels_are_contiguous_and_in_first_appearance_order(x):
    labels = lisc(torch.from_numpy(x)).tolist()
    assert labels == canonical(labels)
    assert set(labels) == set(range(max(labels) + 1))


def test_first_neighbour_is_never_self_and_ties_go_to_lowest_index():
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert first_neighbours(x).tolist() == [1, 0, 0, 0]


def test_one_sample_is_one_cluster():
    assert lisc(torch.randn(1, 5)).tolist() == [0]


def test_two_samples_are_mutual_neighbours_hence_one_cluster():
    assert lisc(torch.tensor([[1.0, 0.0], [0.0, 1.0]])).tolist() == [0, 0]


def test_identical_rows_and_zero_rows_give_defined_labels_without_nan():
    x = torch.zeros(6, 4)
    x[3] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    labels = lisc(x)
    assert labels.tolist() == finch_first_partition(x.numpy())
    x = torch.ones(5, 3)
    assert lisc(x).tolist() == [0] * 5


def test_two_separated_domains_never_share_a_cluster():
    g = torch.Generator().manual_seed(0)
    a = torch.tensor([5.0, 0.0, 0.0]) + 0.1 * torch.randn(10, 3, generator=g)
    b = torch.tensor([0.0, 0.0, 5.0]) + 0.1 * torch.randn(10, 3, generator=g)
    labels = lisc(torch.cat([a, b]))
    assert set(labels[:10].tolist()).isdisjoint(labels[10:].tolist())


def test_rejects_wrong_rank():
    with pytest.raises(ValueError, match=r"\(B, C\)"):
        lisc(torch.randn(4, 3, 2))


@settings(max_examples=60, deadline=None)
@given(instance_means())
def test_ids_without_relabelling_give_the_same_partition(x):
    from dyntta.norm.lisc import canonical_labels

    mu = torch.from_numpy(x)
    ids = lisc(mu, canonical=False)
    assert ((ids >= 0) & (ids < len(x))).all()
    assert canonical(ids) == lisc(mu).tolist()
    assert torch.equal(canonical_labels(ids), lisc(mu))
