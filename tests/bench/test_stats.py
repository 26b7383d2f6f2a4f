"""Intervals and ties against independent references (scipy, closed forms)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dyntta.bench.stats import (
    bootstrap_interval,
    difference_interval,
    median_interval,
    resampled_means,
    same_batches,
    seed_interval,
)


def batches(n_batches, size, p, seed):
    rng = np.random.default_rng(seed)
    counts = np.full(n_batches, size)
    counts[-1] = max(1, size // 3)  # a last, smaller batch
    return rng.binomial(counts, p), counts


def test_bootstrap_interval_matches_scipy_percentile_bootstrap():
    correct, counts = batches(150, 64, 0.55, seed=0)
    ours = bootstrap_interval(correct, counts, resamples=20000)
    ref = stats.bootstrap((correct, counts), lambda c, n: c.sum() / n.sum(), paired=True,
                          vectorized=False, method="percentile", n_resamples=20000,
                          random_state=np.random.default_rng(1)).confidence_interval
    assert ours == pytest.approx((ref.low, ref.high), abs=2e-3)  # Monte Carlo error ~5e-4
    assert ours[0] < correct.sum() / counts.sum() < ours[1]


@pytest.mark.parametrize("last", [64, 21])  # batches of one size, and a last smaller one
def test_resampled_means_are_the_mean_over_seeds_of_the_drawn_batches_accuracies(last):
    """A direct reading: the same draws (the generator's, seed by seed) summed by hand."""
    runs = [batches(40, 64, p, seed=seed) for seed, p in enumerate((0.3, 0.6))]
    for correct, counts in runs:
        counts[-1], correct[-1] = last, min(correct[-1], last)
    rng = np.random.default_rng(5)
    expected = np.zeros(300)
    for correct, counts in runs:
        idx = rng.integers(0, 40, size=(300, 40))
        expected += np.array([correct[i].sum() / counts[i].sum() for i in idx]) / 2
    got = resampled_means(*zip(*runs), seed=5, resamples=300)
    np.testing.assert_array_equal(got, expected)


def test_runs_of_two_to_the_24_samples_or_more_are_drawn_exactly_too():
    """The same direct reading for a run whose draws reach 2^25 samples, which float32 would
    round."""
    counts = np.full(8, 2**22 + 1)
    correct = np.random.default_rng(0).integers(2**21, 2**22, size=8) | 1  # odd: not in float32
    idx = np.random.default_rng(3).integers(0, 8, size=(50, 8))
    expected = np.array([correct[i].sum() / counts[i].sum() for i in idx])
    got = resampled_means([correct], [counts], seed=3, resamples=50)
    np.testing.assert_array_equal(got, expected)


def test_bootstrap_interval_width_matches_the_binomial_standard_error():
    """Independent samples in equal batches: the batch bootstrap reduces to the binomial
    interval, 2 * 1.96 * sqrt(p (1 - p) / n)."""
    correct, counts = batches(400, 32, 0.7, seed=2)
    counts[-1] = 32
    correct[-1] = np.random.default_rng(3).binomial(32, 0.7)
    p, n = correct.sum() / counts.sum(), counts.sum()
    low, high = bootstrap_interval(correct, counts, resamples=20000)
    assert high - low == pytest.approx(2 * 1.96 * np.sqrt(p * (1 - p) / n), rel=0.1)


def test_seed_interval_is_student_t():
    acc = [0.599, 0.566, 0.581]
    ref = stats.t.interval(0.95, 2, loc=np.mean(acc), scale=stats.sem(acc))
    assert seed_interval(acc) == pytest.approx(ref, abs=1e-12)
    with pytest.raises(ValueError, match=">= 2 seeds"):
        seed_interval([0.5])


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 40), st.integers(1, 64), st.floats(0.05, 0.95), st.integers(0, 10**6))
def test_paired_difference_of_a_method_with_itself_is_exactly_zero(nb, size, p, seed):
    correct, counts = batches(nb, size, p, seed)
    run = ([correct], [counts])
    assert difference_interval(run, run) == (0.0, 0.0)


def test_paired_difference_detects_a_small_consistent_gain_that_unpaired_misses():
    """Two methods on the same batches, the second right on 1 more sample in every 64-batch:
    +1.6 points. Shared batch difficulty hides it from the unpaired test, not from the paired."""
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0.2, 0.9, size=100)
    counts = np.full(100, 64)
    worse = rng.binomial(63, difficulty)
    better = worse + 1
    paired = difference_interval(([better], [counts]), ([worse], [counts]))
    unpaired = difference_interval(([better], [counts]), ([worse], [counts]), paired=False)
    assert paired[0] > 0 and paired == pytest.approx((1 / 64, 1 / 64))
    assert unpaired[0] < 0 < unpaired[1]


def test_difference_over_several_seeds_is_of_the_mean_over_seeds():
    a = [batches(30, 16, 0.6, s) for s in (0, 1, 2)]
    b = [(c // 2, n) for c, n in a]
    low, high = difference_interval(([c for c, _ in a], [n for _, n in a]),
                                    ([c for c, _ in b], [n for _, n in b]), resamples=4000)
    gap = np.mean([c.sum() / n.sum() for c, n in a]) - np.mean([c.sum() / n.sum() for c, n in b])
    assert low < gap < high and high - low < 0.2


def test_median_interval_matches_scipy_percentile_bootstrap_of_the_median():
    ratios = np.random.default_rng(4).lognormal(0.15, 0.05, size=45)
    median, low, high = median_interval(ratios, resamples=20000)
    ref = stats.bootstrap((ratios,), np.median, method="percentile", n_resamples=20000,
                          random_state=np.random.default_rng(5)).confidence_interval
    assert median == np.median(ratios)
    assert (low, high) == pytest.approx((ref.low, ref.high), abs=5e-3)  # Monte Carlo error
    assert low <= median <= high


def test_median_interval_of_one_value_has_no_interval_and_constant_values_a_point():
    assert median_interval([1.2])[0] == 1.2 and np.isnan(median_interval([1.2])[1:]).all()
    assert median_interval([1.1] * 7) == (1.1, 1.1, 1.1)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        median_interval([])


def test_bad_inputs_are_errors():
    with pytest.raises(ValueError, match="equal-length"):
        bootstrap_interval([1, 2], [3])
    with pytest.raises(ValueError, match="within 0..size"):
        bootstrap_interval([5], [3])
    with pytest.raises(ValueError, match="same streams"):
        difference_interval(([[1, 2]], [[4, 4]]), ([[1]], [[4]]))


def test_same_batches_pairs_only_equal_seeds_and_batches():
    runs = [[64, 64, 16], [64, 64, 16]]
    assert same_batches(runs, [list(r) for r in runs])
    assert not same_batches(runs, runs[:1])  # a seed fewer
    assert not same_batches(runs, [[64, 64, 16], [64, 64, 15]])  # another last batch
    assert not same_batches(runs, [[64, 64], [64, 64]])
