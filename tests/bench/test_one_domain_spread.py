"""``benchmarks/one_domain_spread.py``: every full batch's spread, filed by whether its images
come from one domain; partial batches left out."""

from __future__ import annotations

import pytest

from benchmarks.one_domain_spread import spreads
from dyntta.data import make_stream
from dyntta.norm.spectrum import log_band_power, signature_spread
from tests.bench.helpers import tiny_source


@pytest.mark.parametrize("seed", [0, 1])
def test_full_batches_are_filed_by_their_domains(seed):
    dataset = tiny_source().dataset  # 3 corruptions of 40 images
    # continual: per domain two full batches of 16 of its 40 images and a partial one of 8
    one, mixed = spreads(dataset, ["continual"], 16, [seed], None, n_domains=3)
    assert len(one) == 3 * 2 and mixed == []
    first = next(iter(make_stream(dataset, n_domains=3, scenario="continual", batch_size=16,
                                  seed=seed)))
    assert one[0] == float(signature_spread(log_band_power(first.x)))
    # CrossMix: the 120 images shuffled, 7 full batches of 16 (each of several domains)
    one, mixed = spreads(dataset, ["crossmix"], 16, [seed], None, n_domains=3)
    assert one == [] and len(mixed) == 7
    assert len(set(mixed)) == 7  # seven different batches

