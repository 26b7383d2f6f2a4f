"""``benchmarks/norm_latency.py``: its two kinds of input are what dyn_adaptive's spectral test
takes for one domain and for two."""

from __future__ import annotations

import torch

from benchmarks.norm_latency import inputs
from dyntta.norm.spectrum import log_band_power, one_domain


def test_uniform_batches_are_one_domain_and_half_blurred_ones_two():
    torch.manual_seed(0)
    one, two = inputs(64, 2, mixed=False), inputs(64, 2, mixed=True)
    assert all(one_domain(log_band_power(x)) for x in one)
    assert not any(one_domain(log_band_power(x)) for x in two)
    assert all(x.min() >= 0 and x.max() <= 1 for x in one + two)
