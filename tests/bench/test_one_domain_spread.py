"""``benchmarks/one_domain_spread.py``: every full batch's spread, filed by whether its images
come from one domain; partial batches left out."""

from __future__ import annotations

import pytest
import torch

from benchmarks.one_domain_spread import spreads, window_shifts
from dyntta.data import make_stream
from dyntta.norm.spectrum import domain_shift, log_band_power, one_domain, signature_spread
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


def test_window_shifts_read_each_batch_against_the_images_before_it():
    """Continual batches of 4 over 3 domains of 40 images: every window of 32 that passes the
    spread test is filed by whether its 32 images share one domain, with the batch's shift from
    the 28 before it."""
    dataset = tiny_source().dataset
    one, mixed = window_shifts(dataset, ["continual"], 4, [0], None, n_domains=3)
    batches = list(make_stream(dataset, n_domains=3, scenario="continual", batch_size=4, seed=0))
    images = torch.cat([b.x for b in batches])
    domains = torch.cat([b.domain for b in batches])
    expected = {True: [], False: []}
    for end in range(32, len(images) + 1, 4):
        window = log_band_power(images[end - 32 : end])
        if one_domain(window):
            truth = len(domains[end - 32 : end].unique()) == 1
            expected[truth].append(float(domain_shift(window, 4)))
    assert (one, mixed) == (expected[True], expected[False])
    assert one and mixed  # both kinds occur here
