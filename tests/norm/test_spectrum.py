"""The spectral signature of images and the one-domain test, against direct readings."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from dyntta.norm.spectrum import (
    FEW_IMAGES_SPREAD,
    FEWEST_IMAGES,
    MIN_IMAGES,
    ONE_DOMAIN_SPREAD,
    domain_shift,
    log_band_power,
    nearest_spectra,
    one_domain,
    signature_spread,
    two_sample_shift,
)


def band_power_reference(x: np.ndarray, bands: int) -> np.ndarray:
    """Per image and channel, written out bin by bin: the mean-removed channel's power
    spectrum, each bin's radial frequency over the corner's, cut into ``bands`` equal bands."""
    b, c, h, w = x.shape
    out = np.zeros((b, bands * c))
    for i in range(b):
        for ch in range(c):
            power = np.abs(np.fft.rfft2(x[i, ch] - x[i, ch].mean())) ** 2
            sums, counts = np.zeros(bands), np.zeros(bands)
            for ky in range(power.shape[0]):
                fy = (ky if ky <= (h - 1) // 2 else ky - h) / h
                for kx in range(power.shape[1]):
                    radius = math.sqrt(fy * fy + (kx / w) ** 2) / math.sqrt(0.5)
                    # a bin on an edge: the band above
                    band = min(int(radius * bands + 1e-9), bands - 1)
                    sums[band] += power[ky, kx]
                    counts[band] += 1
            for band in range(bands):
                out[i, band * c + ch] = math.log(sums[band] / max(counts[band], 1) + 1e-8)
    return out


def smooth_images(b: int, seed: int, size: int = 16) -> torch.Tensor:
    """Images with the falling spectrum of natural ones: smoothed noise."""
    g = torch.Generator().manual_seed(seed)
    return F.avg_pool2d(torch.rand(b, 3, size + 4, size + 4, generator=g), 5, 1)


def noisy(x: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (x + 0.3 * torch.randn(x.shape, generator=g)).clamp(0.0, 1.0)


def blurred(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(x, 5, 1, 2, count_include_pad=False)


@pytest.mark.parametrize("bands,size", [(4, (8, 8)), (3, (7, 10))])
def test_band_power_is_the_mean_power_of_each_radial_band(bands, size):
    x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    np.testing.assert_allclose(log_band_power(x, bands).numpy(),
                               band_power_reference(x.numpy(), bands), rtol=1e-10)


def test_a_channel_scaled_by_a_moves_its_entries_by_2_log_a_and_a_shift_moves_none():
    x = smooth_images(4, seed=2).double()
    scale = torch.tensor([0.5, 2.0, 3.0], dtype=torch.float64)[None, :, None, None]
    moved = log_band_power(x * scale + 7.0) - log_band_power(x)
    expected = (2 * scale.log()).reshape(1, 3).repeat(1, 4).expand_as(moved)
    torch.testing.assert_close(moved, expected, rtol=0, atol=1e-5)  # the 1e-8 floor


def test_one_corruption_is_one_domain_and_a_mixture_is_not():
    base = smooth_images(2 * MIN_IMAGES, seed=3)
    noise, blur = log_band_power(noisy(base, seed=4)), log_band_power(blurred(base))
    assert one_domain(noise[:MIN_IMAGES]) and one_domain(blur[:MIN_IMAGES])
    half = MIN_IMAGES // 2
    mixture = torch.cat([noise[:half], blur[half:MIN_IMAGES]])
    assert not one_domain(mixture) and float(mixture.std(0).mean()) > ONE_DOMAIN_SPREAD


def spread_exactly(n: int, spread: float) -> torch.Tensor:
    """(n, 12) signatures whose every entry has standard deviation ``spread`` across the n."""
    x = torch.randn(n, 12, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    return x if n == 1 else (x - x.mean(0)) / x.std(0) * spread + 3.0


@pytest.mark.parametrize("n", [1, 15, 16, 31, 32, 64])
@pytest.mark.parametrize("spread", [0.5, 0.79, 0.81, 1.19, 1.21])
def test_one_domain_below_the_threshold_of_its_number_of_images(n, spread):
    """Under 1.2 nats with 32 images or more, under 0.8 with 16 to 31, never with fewer."""
    threshold = ONE_DOMAIN_SPREAD if n >= MIN_IMAGES else FEW_IMAGES_SPREAD
    assert (FEW_IMAGES_SPREAD, FEWEST_IMAGES, ONE_DOMAIN_SPREAD) == (0.8, 16, 1.2)
    assert one_domain(spread_exactly(n, spread)) == (n >= FEWEST_IMAGES and spread < threshold)


@pytest.mark.parametrize(("pool", "queries", "k"), [(40, 8, 5), (6, 6, 32), (50, 1, 50)])
def test_nearest_spectra_are_the_rows_at_the_smallest_distances(pool, queries, k):
    signatures = torch.randn(pool, 12, generator=torch.Generator().manual_seed(pool)) * 3 + 5
    index = nearest_spectra(signatures, k, queries)
    distance = ((signatures[-queries:, None] - signatures[None]) ** 2).sum(-1).sqrt()
    expected = distance.sort(1).values[:, : min(k, pool)]
    torch.testing.assert_close(distance.gather(1, index), expected)
    assert index[:, 0].tolist() == list(range(pool - queries, pool))  # each query itself first


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 30), st.integers(1, 40))
def test_nearest_spectra_among_allowed_rows_only(seed, pool, k):
    """With a mask, the nearest allowed rows, as many as are allowed up to k (the queries, the
    last rows, always allowed)."""
    g = torch.Generator().manual_seed(seed)
    signatures = torch.randn(pool, 6, generator=g, dtype=torch.float64)
    queries = int(torch.randint(1, pool + 1, (), generator=g))
    allowed = torch.rand(pool, generator=g) < 0.5
    allowed[-queries:] = True
    index = nearest_spectra(signatures, k, queries, allowed)
    rows = allowed.nonzero().flatten()
    assert index.shape == (queries, min(k, rows.numel()))
    assert allowed[index].all()
    for i, query in enumerate(signatures[-queries:]):
        distance = (signatures[rows] - query).square().sum(1).sqrt()
        torch.testing.assert_close((signatures[index[i]] - query).square().sum(1).sqrt(),
                                   distance.sort().values[: index.shape[1]])


def test_nearest_spectra_of_two_corruptions_keep_to_each_one():
    base = smooth_images(32, seed=11)
    signatures = log_band_power(torch.cat([noisy(base[:16], seed=12), blurred(base[16:])]))
    index = nearest_spectra(signatures, 16, 32)
    assert (index < 16).all(1)[:16].all() and (index >= 16).all(1)[16:].all()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(18, 40), st.integers(1, 12), st.integers(0, 2**16),
       st.floats(0.0, 2.0))
def test_domain_shift_is_the_mean_squared_two_sample_t_statistic(batch, n, d, seed, offset):
    """Per entry, Student's two-sample t (pooled variance) of the batch against the rows before
    it; the shift is the mean of its squares over the entries."""
    batch = min(batch, n - 2)
    g = torch.Generator().manual_seed(seed)
    signatures = torch.randn(n, d, generator=g, dtype=torch.float64)
    signatures[-batch:] += offset
    t = stats.ttest_ind(signatures[-batch:].numpy(), signatures[:-batch].numpy(),
                        equal_var=True).statistic
    assert float(domain_shift(signatures, batch)) == pytest.approx(float(np.mean(t**2)),
                                                                   rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.integers(2, 20), st.integers(2, 20), st.integers(1, 12),
       st.integers(0, 2**16))
def test_stacked_blocks_give_each_blocks_shift_and_spread(blocks, n_1, n_2, d, seed):
    g = torch.Generator().manual_seed(seed)
    stacked = torch.randn(blocks, n_1, d, generator=g, dtype=torch.float64) * 2
    after = torch.randn(n_2, d, generator=g, dtype=torch.float64)
    for i, block in enumerate(stacked):
        assert float(two_sample_shift(stacked, after)[i]) == pytest.approx(
            float(domain_shift(torch.cat([block, after]), n_2)), rel=1e-12)
        assert float(signature_spread(stacked)[i]) == pytest.approx(
            float(block.std(0).mean()), rel=1e-12)
