"""The class-balanced window filter (beyond the paper): its choice against a direct
reading of the rule, its memory, and its effect inside a layer."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dyntta.norm import ClassBalance
from dyntta.norm.adaptive import PooledNorm2d
from tests.norm.bn_helpers import random_bn


class Fixed:
    """A stand-in for WindowMatch: keeps the rows its mask names (the last ``n_window``)."""

    def __init__(self, mask):
        self.mask = mask

    def keep(self, n_window, batch_size):
        return torch.tensor(self.mask[len(self.mask) - n_window :], dtype=torch.bool)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=6), min_size=1, max_size=6),
       st.integers(1, 5), st.integers(0, 40), st.none() | st.integers(0, 2**36))
def test_keep_is_the_most_recent_per_class_of_each_class(batches, per_class, memory, bits):
    seen = [c for batch in batches for c in batch][-memory:] if memory else []
    mask = [bool(bits >> i & 1) for i in range(len(seen))] if bits is not None else None
    balance = ClassBalance(memory, per_class, None if mask is None else Fixed(mask))
    for batch in batches:
        balance.record(torch.tensor(batch), 6)
    for n_window in range(len(seen) + 1):
        rows = seen[len(seen) - n_window :]
        allowed = [True] * n_window if mask is None else mask[len(mask) - n_window :]
        expected = [allowed[i] and [r for r, a in zip(rows[i:], allowed[i:]) if a]
                    .count(rows[i]) <= per_class for i in range(n_window)]
        assert balance.keep(n_window, 4).tolist() == expected


class Decided:
    """A stand-in for WindowMatch: one decision per window size (the same tensor each time it
    is asked) until the next batch's."""

    def __init__(self, mask):
        self.decide(mask)

    def decide(self, mask):
        self.mask, self.decided = mask, {}

    def keep(self, n_window, batch_size):
        if n_window not in self.decided:
            self.decided[n_window] = torch.tensor(self.mask[len(self.mask) - n_window :])
        return self.decided[n_window]


@pytest.mark.parametrize("filtered", [False, True])
def test_keep_decides_once_per_batch_and_anew_after_record_or_a_new_filter_decision(filtered):
    within = Decided([True, False, True, True, True, False, True, True]) if filtered else None

    def fresh(classes):  # the answer of a balance that never decided before
        reference = ClassBalance(8, 1, within)
        reference.record(torch.tensor(classes), 3)
        return reference.keep(8, 4)

    classes = [0, 0, 1, 2, 1, 0, 2, 2]
    balance = ClassBalance(8, 1, within)
    balance.record(torch.tensor(classes), 3)
    first = balance.keep(8, 4)
    assert balance.keep(8, 4) is first  # the other layers of the same batch: no recomputation
    assert torch.equal(first, fresh(classes))
    if filtered:
        within.decide([False, True, True, False, True, True, True, False])
        assert torch.equal(balance.keep(8, 4), fresh(classes))
    balance.record(torch.tensor([1, 1]), 3)
    classes = classes[2:] + [1, 1]
    assert torch.equal(balance.keep(8, 4), fresh(classes))


def test_keep_needs_the_classes_of_every_remembered_sample_and_bad_sizes_are_named():
    balance = ClassBalance(8, 2)
    with pytest.raises(RuntimeError, match="record"):
        balance.keep(2, 2)
    balance.record(torch.tensor([1, 2]), 3)
    with pytest.raises(RuntimeError, match="record"):
        balance.keep(3, 2)
    balance.reset()
    assert balance.classes is None
    with pytest.raises(ValueError, match="per_class"):
        ClassBalance(8, 0)
    with pytest.raises(ValueError, match="memory"):
        ClassBalance(-1, 2)


def test_a_deep_layer_keeps_the_most_recent_sample_of_each_class_only():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 3, 4, 4, generator=g, dtype=torch.float64)
    balance = ClassBalance(memory=6, per_class=1)
    deep = PooledNorm2d(random_bn(3).double(), 9, 0.5)  # a batch of 3 and 6 remembered
    for batch, classes in ((x[:3], [0, 0, 1]), (x[3:6], [1, 0, 2])):
        deep.pool_weight = deep.filter_weights(balance, 3)
        deep(batch)
        balance.record(torch.tensor(classes), 3)
    # remembered x[0..5] of classes 0 0 1 1 0 2: kept x[3] (1), x[4] (0), x[5] (2)
    deep.pool_weight = deep.filter_weights(balance, 3)
    assert deep.pool_weight.tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    alone = PooledNorm2d(random_bn(3).double(), 0, 0.5)
    torch.testing.assert_close(deep(x[6:]), alone(x[3:])[3:])
