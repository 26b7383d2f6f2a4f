"""The window filter shared by layers (beyond the paper): its choice against a direct
reading of the rule, its invariants, and its effect inside a layer."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dyntta.norm import WindowMatch
from dyntta.norm.adaptive import PooledNorm2d
from tests.norm.bn_helpers import random_bn


def observed(match: WindowMatch, batches: list[np.ndarray]) -> WindowMatch:
    for batch in batches:
        match.observe(torch.from_numpy(batch))
    return match


def random_stream(seed: int, batch_size: int, n_batches: int) -> tuple[list, int, np.ndarray]:
    """Batches of 3-d rows around a random centre each, the window that holds all but the last,
    and all the rows in order."""
    rng = np.random.default_rng(seed)
    batches = [rng.normal(size=(batch_size, 3)) + rng.normal(size=3) for _ in range(n_batches)]
    return batches, batch_size * (n_batches - 1), np.concatenate(batches)


def nearest_other_quantile(members: np.ndarray, quantile: float) -> float:
    """The quantile of the members' distances to their nearest other member."""
    nearest_other = [min(np.linalg.norm(a - b) for j, b in enumerate(members) if j != i)
                     for i, a in enumerate(members)]
    return np.quantile(nearest_other, quantile)  # numpy's default is torch's "linear"


def kept_by_the_rule(rows: np.ndarray, n_pool: int, quantile: float) -> list[bool]:
    """The rule read directly: an older row stays when its distance to the nearest pool member
    is at most the ``1 - quantile`` quantile of the pool members' distances to their nearest
    other member."""
    older, pool = rows[:-n_pool], rows[-n_pool:]
    threshold = nearest_other_quantile(pool, 1.0 - quantile)
    return [min(np.linalg.norm(row - member) for member in pool) <= threshold
            for row in older]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(1, 4), st.integers(0, 8),
       st.floats(0.0, 1.0))
def test_keep_follows_the_rule(seed, batch_size, n_batches, pool, quantile):
    batches, memory, rows = random_stream(seed, batch_size, n_batches)
    match = observed(WindowMatch(memory, pool, quantile), batches)
    kept = match.keep(memory, batch_size).tolist()
    n_pool = min(len(rows), max(pool, batch_size))
    expected = kept_by_the_rule(rows, n_pool, quantile) if n_pool >= 2 else []
    # the most recent window rows fill the pool: they always stay
    assert kept == expected + [True] * (memory - len(expected))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_a_higher_quantile_keeps_fewer(seed, q1, q2):
    rng = np.random.default_rng(seed)
    batches = [rng.normal(size=(4, 5)) for _ in range(5)]
    low, high = sorted([q1, q2])
    keep_low = observed(WindowMatch(16, 4, low), batches).keep(16, 4)
    keep_high = observed(WindowMatch(16, 4, high), batches).keep(16, 4)
    assert not (keep_high & ~keep_low).any()


def test_a_remembered_copy_of_a_pool_member_is_kept_and_a_far_one_is_not():
    rng = np.random.default_rng(0)
    batch = rng.normal(size=(6, 4))
    match = observed(WindowMatch(2, 6, 1.0), [np.stack([batch[2], batch[2] + 10.0]), batch])
    assert match.keep(2, 6).tolist() == [True, False]


def test_keep_needs_observe_first_and_bad_sizes_are_named():
    with pytest.raises(RuntimeError, match="observe"):
        WindowMatch(4, 4, 0.1).keep(2, 2)
    with pytest.raises(ValueError, match="quantile"):
        WindowMatch(4, 4, 1.5)
    with pytest.raises(ValueError, match="memory"):
        WindowMatch(-1, 4, 0.1)


def domain_signatures(direction: int, seed: int, b: int = 4, d: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, d, generator=g, dtype=torch.float64)
    x[:, direction] += 8.0  # each domain's signatures lie around one point of its own
    return x


def test_a_deep_layer_drops_window_samples_of_another_domain():
    match = WindowMatch(memory=12, pool=4, quantile=0.1)
    deep = PooledNorm2d(random_bn(3, seed=1).double(), 12, 0.5)
    windowless = PooledNorm2d(random_bn(3, seed=1).double(), 0, 0.5)
    unmatched = PooledNorm2d(random_bn(3, seed=1).double(), 12, 0.5)
    g = torch.Generator().manual_seed(0)
    for direction in (0, 0, 1):
        match.observe(domain_signatures(direction, seed=direction))
        x = torch.randn(4, 3, 5, 5, generator=g, dtype=torch.float64)
        deep.pool_weight = deep.filter_weights(match, 4)
        out, plain, other = deep(x), windowless(x), unmatched(x)
    # the last batch is of another domain: the 8 remembered samples go, the batch stays alone
    assert torch.equal(out, plain)
    assert not torch.allclose(out, other)
    # a fourth batch of the new domain (the third's signatures again) keeps the third, not the
    # first two
    match.observe(domain_signatures(1, seed=1))
    assert match.keep(8, 4).tolist() == [False] * 4 + [True] * 4


def test_reset_forgets_the_signatures():
    match = WindowMatch(8, 4, 0.1)
    match.observe(domain_signatures(0, 0))
    match.reset()
    assert match.current is None
    with pytest.raises(RuntimeError, match="observe"):
        match.keep(0, 4)


def kept_by_blocks(rows: np.ndarray, size: int, quantile: float) -> list[bool]:
    """The block rule read directly, on a pool of the last ``size`` rows: the image rule, then
    each block of ``size`` older rows counted back from the pool (the oldest may be shorter)
    of 16 or more whose spread (the mean over the entries of their standard deviation) is
    under 1.2 (32 rows or more) or 0.8 (fewer) is kept whole where the mean over the entries
    of the two-sample squared t statistic against the pool is under 4, else dropped whole."""
    kept = kept_by_the_rule(rows, size, quantile)
    older, pool = rows[:-size], rows[-size:]
    for end in range(len(older), 0, -size):
        block = older[max(0, end - size) : end]
        if len(block) < 16 or block.std(0, ddof=1).mean() >= (1.2 if len(block) >= 32 else 0.8):
            continue
        n1, n2 = len(block), size
        pooled = (((block - block.mean(0)) ** 2).sum(0) + ((pool - pool.mean(0)) ** 2).sum(0)) \
            / (n1 + n2 - 2)
        t2 = ((pool.mean(0) - block.mean(0)) ** 2 / (pooled * (1 / n1 + 1 / n2))).mean()
        kept[max(0, end - size) : end] = [bool(t2 < 4.0)] * len(block)
    return kept


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([16, 20, 32]), st.integers(1, 4),
       st.sampled_from([0, 5, 17]), st.floats(0.0, 1.0))
def test_blocks_of_one_domain_are_kept_or_dropped_whole(seed, size, n_blocks, rest, quantile):
    rng = np.random.default_rng(seed)
    # blocks tight (one domain of their own) or wide, around the pool's centre or away from it
    centres = [rng.choice([0.0, 0.3, 3.0]) for _ in range(n_blocks + 2)]
    spreads = [rng.choice([0.3, 1.0, 2.0]) for _ in range(n_blocks + 1)]
    older = [rng.normal(centres[i], spreads[i], size=(size, 3)) for i in range(n_blocks)]
    older.insert(0, rng.normal(centres[-2], spreads[-1], size=(rest, 3)))
    rows = np.concatenate([*older, rng.normal(centres[-1], 0.3, size=(size, 3))])
    memory = len(rows) - size
    match = observed(WindowMatch(memory, size, quantile), [rows[:memory], rows[memory:]])
    match.blocks = size
    assert match.keep(memory, size).tolist() == kept_by_blocks(rows, size, quantile)


def test_blocks_under_sixteen_leave_the_image_rule():
    batches, memory, rows = random_stream(3, 8, 6)
    plain = observed(WindowMatch(memory, 8, 0.1), batches).keep(memory, 8)
    match = observed(WindowMatch(memory, 8, 0.1), batches)
    match.blocks = 8
    assert torch.equal(match.keep(memory, 8), plain)


def test_fewer_remembered_than_a_block_are_judged_as_one_shorter_block_without_warnings():
    rng = np.random.default_rng(5)
    tight = rng.normal(0.0, 0.3, size=(20, 3))  # one domain of its own, near the pool
    rows = np.concatenate([tight, rng.normal(0.0, 0.3, size=(32, 3))])
    match = observed(WindowMatch(20, 32, 0.9), [rows[:20], rows[20:]])
    match.blocks = 32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = match.keep(20, 32)
    assert kept.tolist() == kept_by_blocks(rows, 32, 0.9) == [True] * 20
    assert not all(kept_by_the_rule(rows, 32, 0.9))  # the image rule alone drops some
