"""``benchmarks/deep_filter_domains.py``: on the batches judged one domain that truly are, the
images the deep filter keeps, against a reading of its rule written out (with blocks of the batch
size, as ``dyn_adaptive`` sets it), and the precision and recall of what it keeps."""

from __future__ import annotations

import pytest
import torch

import dyntta
from benchmarks.deep_filter_domains import kept_images, purity
from tests.norm.test_window_match import kept_by_blocks


@pytest.fixture
def method():
    return dyntta.adapt(dyntta.models.build("resnet20").eval(), "dyn_adaptive", deep_window=160)


def test_the_kept_images_are_those_the_filter_keeps_on_true_one_domain_batches(method):
    g = torch.Generator().manual_seed(0)
    centres = {0: 0.0, 1: 6.0, 2: 6.0, 3: 12.0}  # domains 1 and 2 look alike
    plan = [[0] * 32, [0] * 32, [1] * 32, [0] * 16 + [3] * 16, [1] * 16 + [2] * 16, [3] * 32,
            [0] * 32, [3] * 32]
    batches = [(torch.tensor([centres[d] for d in p], dtype=torch.float64)[:, None]
                + 0.1 * torch.randn(32, 12, generator=g, dtype=torch.float64),
                torch.tensor(p)) for p in plan]
    got = list(kept_images(method, batches))
    # the first has nothing remembered, the fourth spreads as two domains, the fifth looks one
    # domain but is two
    expected = [1, 2, 5, 6, 7]
    assert len(got) == len(expected)
    signatures = torch.cat([s for s, _ in batches]).numpy()
    domains = torch.cat([d for _, d in batches])
    for (keep, remembered, domain), i in zip(got, expected):
        start, end = max(0, 32 * i - (160 - 32)), 32 * i
        assert domain == plan[i][0]
        assert torch.equal(remembered, domains[start:end])
        # the filter with blocks of the batch size, as the method sets it
        assert keep.tolist() == kept_by_blocks(signatures[start : end + 32], 32, 0.1)
    # far apart domains: the filter keeps only the pool's own, and most of them
    keep, remembered, domain = got[-1]
    assert not keep[remembered != domain].any() and keep[remembered == domain].sum() >= 30


def test_purity_counts_what_is_kept_of_the_pools_domain():
    kept = [(torch.tensor([True, True, False, True]), torch.tensor([1, 2, 1, 1]), 1),
            (torch.tensor([False, True]), torch.tensor([0, 3]), 3)]
    # kept 3 + 1, of the pool's domain 2 + 1, of its domain 3 + 1
    assert purity(kept) == {"batches": 2, "kept": 2.0, "precision": 0.75, "recall": 0.75}
    assert purity([]) == {"batches": 0, "kept": 0.0, "precision": 0.0, "recall": 0.0}
