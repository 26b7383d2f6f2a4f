"""``benchmarks/one_domain_spread.py``: every full batch's spread, filed by whether its images
come from one domain; partial batches left out."""

from __future__ import annotations

from benchmarks.one_domain_spread import spreads
from dyntta.data import make_stream
from dyntta.norm.spectrum import log_band_power
from tests.bench.helpers import tiny_source


def test_full_batches_are_filed_by_their_domains():
    dataset = tiny_source().dataset  # 3 corruptions of 40 images
    one, mixed = spreads(dataset, ["continual", "crossmix"], 16, [0, 1], None, n_domains=3)
    expected = {True: [], False: []}
    for scenario in ("continual", "crossmix"):
        for seed in (0, 1):
            for batch in make_stream(dataset, n_domains=3, scenario=scenario, batch_size=16,
                                     seed=seed):
                if len(batch.x) == 16:
                    spread = float(log_band_power(batch.x).std(0).mean())
                    expected[len(batch.domain.unique()) == 1].append(spread)
    # continual: per seed and domain two full batches of 16 of its 40 images, the 8 left over
    # make a partial batch
    assert len(one) == 2 * 3 * 2 and one == expected[True]
    assert mixed == expected[False] and len(mixed) >= 2 * 7
