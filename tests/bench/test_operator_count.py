"""``benchmarks/operator_count.py``: it counts each operator dispatched, views not."""

from __future__ import annotations

import torch

from benchmarks.operator_count import OperatorCount, count_operators


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
