"""DATTA (backward-free part): the domain-diversity score, the KDE decision and DABN."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import dyntta
from dyntta.methods import datta as datta_module
from dyntta.methods.datta import (
    DomainDiversityBatchNorm2d,
    diversity_score,
    is_single_domain,
)
from tests.conftest import random_images, tiny_resnet
from tests.norm.test_layers import mixed_batch, source_bn


def test_score_equals_a_per_position_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 2, 2, generator=g, dtype=torch.float64)
    src = torch.randn(3, generator=g, dtype=torch.float64)
    batch = x.mean(dim=(0, 2, 3))
    angles = []
    for i in range(4):
        cosines = []
        for h in range(2):
            for w in range(2):
                a, b = src - x[i, :, h, w], batch - x[i, :, h, w]
                cosines.append(float(a @ b / (a.norm() * b.norm())))
        angles.append(math.acos(sum(cosines) / 4))
    assert diversity_score(x, src) == pytest.approx(float(np.std(angles)), rel=1e-9)


def bimodal(n=60, seed=0, heights=(1.0, 1.0)):
    rng = np.random.default_rng(seed)
    low = rng.normal(0.1, 0.01, int(n * heights[0]))
    high = rng.normal(0.3, 0.01, int(n * heights[1]))
    return list(np.concatenate([low, high]))


def test_decision_is_below_the_valley_between_two_balanced_peaks():
    cache = bimodal()
    assert is_single_domain(cache, 0.12)
    assert not is_single_domain(cache, 0.28)
    assert not is_single_domain(bimodal(heights=(1.0, 0.2)), 0.12)  # unbalanced peaks
    rng = np.random.default_rng(1)
    assert not is_single_domain(list(rng.normal(0.2, 0.01, 80)), 0.1)  # one peak
    assert not is_single_domain([0.2] * 60, 0.1)  # no spread


def test_dabn_mixes_source_and_unbiased_batch_statistics():
    bn = source_bn().double()
    x = mixed_batch()
    var, mean = torch.var_mean(x, dim=(0, 2, 3), unbiased=True)
    m = 0.6 * bn.running_mean + 0.4 * mean
    v = 0.6 * bn.running_var + 0.4 * var
    expected = (x - m.view(1, -1, 1, 1)) / torch.sqrt(v.view(1, -1, 1, 1) + bn.eps)
    expected = expected * bn.weight.view(1, -1, 1, 1) + bn.bias.view(1, -1, 1, 1)
    torch.testing.assert_close(DomainDiversityBatchNorm2d(bn, 0.6).double()(x), expected)


def priors(method):
    return {round(float(m.prior), 6) for m in method.modules()
            if isinstance(m, DomainDiversityBatchNorm2d)}


def test_warm_up_is_multi_domain_then_the_decision_sets_every_layer(monkeypatch):
    method = dyntta.adapt(tiny_resnet(), "datta", warmup=5)
    calls = []
    monkeypatch.setattr(datta_module, "is_single_domain",
                        lambda cache, score, ratio: calls.append(len(cache)) or True)
    for i in range(4):  # the code decides from its 50th batch on (cache [0] + 50 scores)
        method(random_images(6, seed=i))
        assert priors(method) == {0.85} and method.last_single is False
    method(random_images(6, seed=9))
    assert priors(method) == {0.6} and method.last_single is True
    assert calls == [5]  # the initial 0 was dropped: 5 real scores
    method.reset()
    assert method.cache == [0.0]


def test_bad_priors_are_named():
    with pytest.raises(ValueError, match="single_prior"):
        dyntta.adapt(tiny_resnet(), "datta", single_prior=1.5)
