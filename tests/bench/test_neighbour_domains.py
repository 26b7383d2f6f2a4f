"""``benchmarks/neighbour_domains.py``: the share of each sample's neighbours in its domain, by
each rule, against a reading of every distance and similarity written out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.neighbour_domains import RULES, shares
from dyntta.norm.spectrum import MIN_IMAGES


def share_reference(signatures, features, domains, queries, n):
    signatures, features, domains = (t.numpy() for t in (signatures, features, domains))
    unit = features / np.linalg.norm(features, axis=1, keepdims=True)
    found = {rule: [] for rule in RULES}
    for q in range(len(domains) - queries, len(domains)):
        distance = np.sqrt(((signatures - signatures[q]) ** 2).sum(1))
        similarity = unit @ unit[q]
        spectral = np.argsort(distance, kind="stable")
        picks = {"spectra": spectral[:n],
                 "instance means": np.argsort(-similarity, kind="stable")[:n]}
        candidates = spectral[:MIN_IMAGES]
        picks["dyn_adaptive"] = candidates[np.argsort(-similarity[candidates], kind="stable")[:n]]
        for rule, pick in picks.items():
            others = [i for i in pick if i != q]
            found[rule].append(np.mean(domains[others] == domains[q]))
    return {rule: float(np.mean(v)) for rule, v in found.items()}


@pytest.mark.parametrize(("pool", "queries", "n"), [(80, 16, 8), (40, 40, 4), (20, 5, 3)])
def test_shares_are_the_neighbours_in_each_sample_s_domain(pool, queries, n):
    g = torch.Generator().manual_seed(pool)
    domains = torch.randint(0, 4, (pool,), generator=g)
    # spectra that follow the domain loosely; features that do not follow it at all
    signatures = domains[:, None].double() + torch.randn(pool, 12, generator=g,
                                                         dtype=torch.float64)
    features = torch.randn(pool, 6, generator=g, dtype=torch.float64)
    got = shares(signatures, features, domains, queries, n)
    expected = share_reference(signatures, features, domains, queries, n)
    assert got == pytest.approx(expected)
    assert got["spectra"] > got["instance means"]
