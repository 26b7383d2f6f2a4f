"""Neighbourhoods instead of LISC clusters (beyond the paper): the nearest neighbours against
sorting every similarity, their statistics against the pooled pixels, and the layer's limiting
cases (one neighbour: instance statistics; the whole pool: one group)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dyntta.norm.adaptive import NeighbourhoodNorm2d, PooledNorm2d
from dyntta.norm.layers import mix, normalize
from dyntta.norm.neighbours import nearest_neighbours
from dyntta.norm.stats import instance_stats, neighbourhood_stats, rows, weighted_stats
from tests.norm.test_layers import mixed_batch, source_bn


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 30), st.integers(1, 30), st.integers(1, 40))
def test_nearest_neighbours_are_the_most_similar_rows(seed, pool_size, n_queries, n):
    rng = np.random.default_rng(seed)
    pool = rng.normal(size=(pool_size, 5))
    n_queries = min(n_queries, pool_size)
    index = nearest_neighbours(torch.from_numpy(pool), n, n_queries).numpy()
    unit = pool / np.linalg.norm(pool, axis=1, keepdims=True)
    sim = unit[pool_size - n_queries :] @ unit.T
    expected = -np.sort(-sim, axis=1)[:, : min(n, pool_size)]  # the top similarities, sorted
    np.testing.assert_allclose(np.take_along_axis(sim, index, 1), expected, rtol=0, atol=1e-12)
    assert all(len(set(row)) == len(row) for row in index.tolist())
    # each query (a pool row) finds itself first
    assert index[:, 0].tolist() == list(range(pool_size - n_queries, pool_size))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 30), st.integers(1, 30), st.integers(1, 30),
       st.integers(1, 40))
def test_nearest_neighbours_among_candidates_are_their_most_similar_rows(
        seed, pool_size, n_queries, k, n):
    rng = np.random.default_rng(seed)
    pool = rng.normal(size=(pool_size, 5))
    n_queries, k = min(n_queries, pool_size), min(k, pool_size)
    candidates = np.stack([rng.permutation(pool_size)[:k] for _ in range(n_queries)])
    index = nearest_neighbours(torch.from_numpy(pool), n, n_queries,
                               torch.from_numpy(candidates)).numpy()
    unit = pool / np.linalg.norm(pool, axis=1, keepdims=True)
    sim = unit[pool_size - n_queries :] @ unit.T
    for row, query_sim, allowed in zip(index, sim, candidates):
        assert set(row) <= set(allowed) and len(set(row)) == len(row) == min(n, k)
        expected = -np.sort(-query_sim[allowed])[: min(n, k)]
        np.testing.assert_allclose(query_sim[row], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("queries", [0, 4])
def test_nearest_neighbours_names_queries_outside_the_pool(queries):
    with pytest.raises(ValueError, match="queries must be in 1..3"):
        nearest_neighbours(torch.randn(3, 2), 2, queries)


@given(st.integers(0, 10_000), st.integers(1, 40), st.integers(1, 9), st.lists(
    st.integers(1, 6), min_size=0, max_size=3), st.sampled_from([torch.float32, torch.float64]))
def test_rows_are_advanced_indexing_bit_for_bit(seed, pool, channels, shape, dtype):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(pool, channels, generator=g, dtype=dtype)
    index = torch.randint(0, pool, tuple(shape), generator=g)
    assert torch.equal(rows(table, index), table[index])


def test_neighbourhood_stats_are_the_statistics_of_the_pooled_pixels():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 4, 5, generator=g, dtype=torch.float64) * torch.arange(1, 8).view(
        7, 1, 1, 1) + torch.arange(7).view(7, 1, 1, 1)
    mu, s2 = instance_stats(x, unbiased=False)
    index = torch.tensor([[0, 3, 6], [2, 2, 5], [4, 1, 0]])
    mean, var, spread = neighbourhood_stats(mu, s2, index)
    for i, rows in enumerate(index.tolist()):
        pixels = torch.cat([x[j] for j in rows], dim=1)  # (C, len(rows) * H, W)
        torch.testing.assert_close(mean[i], pixels.mean((1, 2)))
        torch.testing.assert_close(var[i], pixels.var((1, 2), unbiased=False))
        # the spread of the members' means: their variance, repeats counted as often as named
        torch.testing.assert_close(spread[i], mu[rows].var(0, unbiased=False))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 12), st.floats(-50.0, 50.0))
def test_weighted_stats_are_the_statistics_of_the_weighted_pixels(seed, groups, offset):
    """Weights over the pool's rows (each row summing to 1): the weighted pixels' mean and
    variance, and the weighted variance of the members' means, whatever the common offset."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(9, 3, 4, 5, generator=g, dtype=torch.float64) * torch.arange(1, 10).view(
        9, 1, 1, 1) + offset
    mu, s2 = instance_stats(x, unbiased=False)
    weights = torch.rand(groups, 9, generator=g, dtype=torch.float64)
    weights[weights < 0.4] = 0.0
    weights[:, 0] += 0.1  # no empty group
    weights /= weights.sum(1, keepdim=True)
    mean, var, spread = weighted_stats(mu, s2, weights)
    for i, w in enumerate(weights):
        pixel_mean = (w[:, None] * mu).sum(0)
        second = (w[:, None] * (s2 + mu.square())).sum(0)  # E[x^2] over the weighted pixels
        torch.testing.assert_close(mean[i], pixel_mean)
        torch.testing.assert_close(var[i], second - pixel_mean.square())
        torch.testing.assert_close(spread[i], (w[:, None] * (mu - pixel_mean).square()).sum(0))
    index = torch.tensor([[0, 3, 6], [2, 5, 8]])  # equal weights: a neighbourhood's statistics
    equal = torch.zeros(2, 9, dtype=torch.float64).scatter_(1, index, 1.0 / 3)
    for got, expected in zip(weighted_stats(mu, s2, equal), neighbourhood_stats(mu, s2, index)):
        torch.testing.assert_close(got, expected)


def test_neighbourhoods_covering_the_batch_are_one_pool():
    bn = source_bn().double()
    x = mixed_batch(b=10)
    pooled = PooledNorm2d(bn, 0, 4.0 / (4.0 + 10)).double()
    for n in (10, 64):  # the whole batch, or more than it holds
        whole = NeighbourhoodNorm2d(bn, 0, n, prior_strength=4.0).double()
        torch.testing.assert_close(whole(x), pooled(x))


def test_one_neighbour_mixes_each_samples_own_statistics_with_the_source():
    bn = source_bn().double()
    x = mixed_batch(b=6)
    layer = NeighbourhoodNorm2d(bn, 0, 1, prior_strength=2.0).double()
    mu, s2 = instance_stats(x)
    a = 2.0 / (2.0 + 1.0)
    expected = normalize(x, mix(bn.running_mean, mu, a), mix(bn.running_var, s2, a),
                         bn.weight, bn.bias, bn.eps)
    torch.testing.assert_close(layer(x), expected)
