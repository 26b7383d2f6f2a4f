"""Lepski's rule for neighbourhood widths against a direct reading, one query at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dyntta.norm.neighbours import widest_consistent


def reference(mean, var, queries, smallest, z):
    """The rule read literally: sort, widen while every narrower mean is within the bound."""
    p, c = mean.shape
    sizes = []
    n = smallest
    while n < p:
        sizes.append(n)
        n *= 2
    sizes.append(p)
    unit = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    out = []
    for q in range(p - queries, p):
        order = np.argsort(-(unit @ unit[q]), kind="stable")
        stats = []
        for n in sizes:
            members = mean[order[:n]]
            m = members.mean(0)
            d = ((members - m) ** 2).mean(0)
            stats.append((n, m, var[order[:n]].mean(0) + d, d))
        chosen = 0
        for k in range(1, len(sizes)):
            n_k, m_k, _, d_k = stats[k]
            if any(((m_k - stats[j][1]) ** 2 / (d_k / stats[j][0])).mean()
                   > 1 + z * np.sqrt(2 / c) for j in range(k)):
                break
            chosen = k
        out.append(stats[chosen])
    return out


@pytest.mark.parametrize("seed,p,queries,smallest,z", [
    (0, 96, 32, 4, 2.0), (1, 64, 64, 2, 1.0), (2, 50, 10, 3, 3.0), (3, 200, 16, 4, 0.5)])
def test_matches_the_direct_reading(seed, p, queries, smallest, z):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2, (3, 12))
    mean = centres[rng.integers(0, 3, p)] + rng.normal(0, 1, (p, 12)) + 4
    var = rng.uniform(0.5, 2, (p, 12))
    m, v, d, n = widest_consistent(torch.from_numpy(mean), torch.from_numpy(var), queries,
                                   smallest, z)
    want = reference(mean, var, queries, smallest, z)
    assert n[:, 0].tolist() == [w[0] for w in want]
    for got, i in ((m, 1), (v, 2), (d, 3)):
        np.testing.assert_allclose(got.numpy(), np.stack([w[i] for w in want]), rtol=1e-9)
    assert len(set(n[:, 0].tolist())) > 1  # the inputs exercise more than one width


def test_a_batch_of_one_statistic_widens_to_the_pool():
    mean = torch.ones(40, 5) * torch.arange(1.0, 6.0)
    _, _, spread, n = widest_consistent(mean, torch.ones(40, 5), 8, 2, 2.0)
    assert n.flatten().tolist() == [40.0] * 8
    assert spread.abs().max() == 0


def test_never_crosses_into_a_far_component():
    rng = np.random.default_rng(5)
    axes = np.eye(16)[:2] * 50  # two components, orthogonal directions
    label = np.arange(128) % 2
    mean = axes[label] + rng.normal(0, 1, (128, 16)) + 1
    _, _, _, n = widest_consistent(torch.from_numpy(mean), torch.ones(128, 16, dtype=torch.float64),
                                   64, 4, 2.0)
    assert n.max() <= 64
