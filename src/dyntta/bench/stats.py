"""Uncertainty of benchmark accuracies: 95% intervals and ties.

One run (one seed) of a method adapts online, batch after batch, so the samples of a batch are
not independent: they are normalised (and, for the gradient methods, learnt from) together.
Its interval is therefore a percentile bootstrap over test *batches* (Efron & Tibshirani, 1993,
ch. 13): batches are drawn with replacement and the accuracy of each draw is its hits over its
samples (a ratio estimator, exact for a last batch of another size). With several seeds the
mean over seeds gets Student's t interval over the per-seed accuracies (n - 1 degrees of
freedom), which also covers what changes from seed to seed (stream order, rows drawn).

Ties: two methods run on the same streams (same seeds, same planned batches) are compared
*paired*: the same resampled batches score both, per seed, and the difference of their mean
accuracies gets a percentile bootstrap interval; they are tied when it contains 0. Pairing
removes the difficulty shared by both methods from the comparison, so it is more sensitive
than comparing two printed intervals.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000


def _as_runs(correct: Sequence[Sequence[int]], counts: Sequence[Sequence[int]]):
    runs = []
    for c, n in zip(correct, counts, strict=True):
        c, n = np.asarray(c, dtype=np.float64), np.asarray(n, dtype=np.float64)
        if c.shape != n.shape or c.ndim != 1 or c.size == 0:
            raise ValueError(f"per-batch hits and sizes must be equal-length 1-D lists, got "
                             f"{c.shape} and {n.shape}")
        if (n <= 0).any() or (c < 0).any() or (c > n).any():
            raise ValueError("per-batch sizes must be >= 1 and hits within 0..size")
        runs.append((c, n))
    if not runs:
        raise ValueError("no runs to compute an interval from")
    return runs


@functools.lru_cache(maxsize=8)
def _draw_counts(seed: int, resamples: int, sizes: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """For runs of ``sizes`` batches, each run's batches drawn with replacement, run after run
    from one generator seeded ``seed``: (resamples, size) counts of how often each batch is
    drawn (read-only; kept for the next calls with these arguments: a table compares many
    methods on the same streams, and each comparison draws the same batches)."""
    rng = np.random.default_rng(seed)
    counts = []
    for size in sizes:
        idx = rng.integers(0, size, size=(resamples, size))
        idx += np.arange(resamples)[:, None] * size  # row r's draws into its own bins
        count = np.bincount(idx.ravel(), minlength=resamples * size)
        count = count.reshape(resamples, size).astype(np.float32)  # whole numbers, exact
        count.flags.writeable = False
        counts.append(count)
    return tuple(counts)


def _resampled_accuracy(runs, seed: int, resamples: int) -> np.ndarray:
    """(resamples, n_runs): accuracy of each run on batches drawn with replacement; the draws
    depend only on ``seed`` and the runs' numbers of batches, so two calls with equal seeds and
    batch counts draw the same batches (pairing). The hits and samples of a draw are sums of
    whole numbers, exact in any order: in float32 where no draw can reach 2^24 samples, else in
    float64."""
    out = np.empty((resamples, len(runs)))
    counts = _draw_counts(seed, resamples, tuple(c.size for c, _ in runs))
    for j, ((c, n), count) in enumerate(zip(runs, counts)):
        dtype = np.float32 if c.size * n.max() < 2**24 else np.float64
        count = count.astype(dtype, copy=False)
        hits, samples = (count @ t.astype(dtype) for t in (c, n))
        out[:, j] = hits.astype(np.float64) / samples.astype(np.float64)
    return out


def percentile_interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def median_interval(
    values: Sequence[float], confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Median of ``values`` (e.g. per-repeat latency ratios of two methods timed in turn) and a
    percentile bootstrap interval of it; one value gives the interval (nan, nan).

    Returns ``(median, low, high)``.
    """
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {values.shape}")
    median = float(np.median(values))
    if values.size < 2:
        return median, float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, values.size, size=(resamples, values.size))
    return (median, *percentile_interval(np.median(values[idx], axis=1), confidence))


def bootstrap_interval(
    correct: Sequence[int], counts: Sequence[int], confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES, seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of one run's accuracy ``sum(correct) / sum(counts)``.

    Args:
        correct: (n_batches,) hits per test batch.
        counts: (n_batches,) samples per test batch.
    Returns ``(low, high)`` as fractions.
    """
    runs = _as_runs([correct], [counts])
    draws = _resampled_accuracy(runs, seed, resamples)[:, 0]
    return percentile_interval(draws, confidence)


def seed_interval(accuracies: Sequence[float], confidence: float = CONFIDENCE
                  ) -> tuple[float, float]:
    """Student's t interval of the mean of per-seed accuracies (needs two or more)."""
    from scipy import stats as scipy_stats  # imported here: it is a large part of the CLI's start

    a = np.asarray(accuracies, dtype=np.float64)
    if a.size < 2:
        raise ValueError(f"an interval over seeds needs >= 2 seeds, got {a.size}")
    half = scipy_stats.t.ppf(0.5 + confidence / 2, a.size - 1) * a.std(ddof=1) / np.sqrt(a.size)
    return float(a.mean() - half), float(a.mean() + half)


def difference_interval(
    first: tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]],
    second: tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]],
    paired: bool = True, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Bootstrap interval of ``mean_seed acc(first) - mean_seed acc(second)``.

    Each argument is ``(hits per batch, samples per batch)``, one list per seed. ``paired``:
    both ran on the same streams (same seeds in the same order, the same planned batches), so
    the same resampled batches score both; otherwise the two are resampled independently.
    """
    for run in (first, second):
        _as_runs(*run)  # malformed input is named as such before the pairing check
    if paired and not same_batches(first[1], second[1]):
        raise ValueError("a paired comparison needs the same streams: equal seeds and batches")
    da = resampled_means(*first, seed=seed, resamples=resamples)
    db = resampled_means(*second, seed=seed if paired else seed + 1, resamples=resamples)
    return percentile_interval(da - db, confidence)


def same_batches(first: Sequence[Sequence[int]], second: Sequence[Sequence[int]]) -> bool:
    """Whether two methods' runs (samples per batch, one list per seed) have the same seeds and
    batches, so that their bootstrap draws pair."""
    return len(first) == len(second) and all(
        np.array_equal(x, y) for x, y in zip(first, second))


def resampled_means(correct: Sequence[Sequence[int]], counts: Sequence[Sequence[int]],
                    seed: int = 0, resamples: int = RESAMPLES) -> np.ndarray:
    """(resamples,) bootstrap draws of the mean over runs (seeds) of their accuracies, batches
    drawn with replacement. Calls with equal ``seed`` and equal batch counts draw the same
    batches, so draws of methods run on the same streams are paired."""
    runs = _as_runs(correct, counts)
    return _resampled_accuracy(runs, seed, resamples).mean(1)
