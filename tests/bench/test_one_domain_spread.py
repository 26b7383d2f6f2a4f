"""``benchmarks/one_domain_spread.py``: every full batch's spread, filed by whether its images
come from one domain; partial batches left out."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.one_domain_spread import corrupted_images, spreads
from dyntta.bench.sources import SourceOptions
from dyntta.data import CORRUPTIONS, make_stream
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


def test_an_npz_is_corrupted_without_a_model(tmp_path):
    """The images' folder holds only the .npz: the benchmark builds its 15 corruptions at
    severity 5 (the same set on a second call, from the cache) and needs no model."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(4, 32, 32, 3), dtype=np.uint8)
    y = np.arange(4) % 3
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "few.npz", x=x, y=y)
    options = SourceOptions(str(tmp_path / "data"), str(tmp_path / "cache"), severities=(5,))
    dataset = corrupted_images("npz", "few.npz", options)
    assert sorted(dataset.corruptions) == sorted(CORRUPTIONS) and list(dataset.severities) == [5]
    assert np.array_equal(dataset.labels, y)
    again = corrupted_images("npz", "few.npz", options)
    assert np.array_equal(again.images("fog", 5), dataset.images("fog", 5))
    assert not np.array_equal(dataset.images("fog", 5), x)
