"""``benchmarks/operator_count.py``: it counts each operator dispatched, views not; and counts
it makes of the windowed layers."""

from __future__ import annotations

import pytest
import torch

from benchmarks.operator_count import OperatorCount, count_operators
from dyntta.norm.adaptive import NeighbourhoodNorm2d, PooledNorm2d
from dyntta.norm.stats import instance_stats
from tests.norm.bn_helpers import random_bn


def test_each_operator_counts_once_and_views_not_at_all():
    x = torch.rand(4, 6)
    with OperatorCount() as count:
        y = (x + 1.0).view(24)[2:].unsqueeze(0).t()
        torch.mm(y.t(), y).sum()
    assert dict(count.counts) == {"add": 1, "mm": 1, "sum": 1}


def test_the_counted_forward_is_the_one_after_the_warmup():
    seen = []

    def method(x):
        seen.append(x)
        return x * 2.0

    xs = [torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)]
    counts = count_operators(method, xs, warmup=4)
    assert [float(x) for x in seen] == [0.0, 1.0, 2.0, 0.0, 1.0]
    assert dict(counts) == {"mul": 1}


@pytest.mark.parametrize("layer", ["neighbourhood", "pooled"])
def test_a_full_window_is_kept_without_a_copy(layer):
    """Once a windowed layer's window is full, a batch its owner did not mark one domain makes
    no copy: the next window is the pool the layer put together."""
    bn = random_bn(3)
    if layer == "neighbourhood":
        m = NeighbourhoodNorm2d(bn, window=8, neighbours=2, prior_strength=16.0)
    else:
        m = PooledNorm2d(bn, window=8, source_weight=0.5)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for _ in range(3):
            m(torch.randn(4, 3, 5, 5, generator=g))
        before = m.window_mean.clone()
        with OperatorCount() as count:
            m(torch.randn(4, 3, 5, 5, generator=g))
    assert count.counts["clone"] == 0 and count.counts["cat"] == 2
    # the window: the newest 4 samples before the batch, then the batch's 4
    assert torch.equal(m.window_mean[:4], before[4:])


@pytest.mark.parametrize("layer", ["neighbourhood", "pooled"])
def test_a_batch_of_one_domain_is_normalised_with_its_groups_one_row(layer):
    """Eager, on a batch its owner marked one domain, a windowed layer (with the instance rule,
    which that batch skips) copies its group's statistics to no sample: it normalises with the
    group's (C,) row, giving what the traced operator's (B, C) rows give."""
    bn = random_bn(3)
    if layer == "neighbourhood":
        m = NeighbourhoodNorm2d(bn, window=8, neighbours=2, prior_strength=16.0,
                                instance=(8.0, 2.5))
    else:
        m = PooledNorm2d(bn, window=8, source_weight=0.5, instance=(8.0, 2.5))
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for _ in range(3):
            m(torch.randn(4, 3, 5, 5, generator=g))
        m.domain_rows.fill_(8)
        x = torch.randn(4, 3, 5, 5, generator=g)
        before, n_window = (m.window_mean, m.window_var), m.n_window(4)
        with OperatorCount() as count:
            mean, var = m.statistics(x)
        mu, s2 = instance_stats(x)
        traced = m.traced_operator(mu, s2, *before, n_window, m.window,
                                   *m.arguments(mu, n_window, 25))
    assert count.counts["clone"] == 0 and mean.shape == var.shape == (3,)
    assert traced[0].shape == (4, 3)
    assert torch.equal(traced[0], mean.expand(4, 3)) and torch.equal(traced[1], var.expand(4, 3))
