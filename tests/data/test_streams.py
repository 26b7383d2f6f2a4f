"""Dynamic streams: sample counts per scenario, batch composition, label shift, determinism."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dyntta.data import CORRUPTIONS, SCENARIOS, ArrayCorruptedDataset, label_shift_order, make_stream
from dyntta.data.streams import APPEARANCES

N_CLASSES = 10


def make_dataset(n_per_class: int = 20, n_domains: int = 3, size: int = 4, seed: int = 0):
    """Random images per (corruption, severity 5), labels sorted by class (like the real data)."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(N_CLASSES), n_per_class)
    arrays = {
        (c, 5): rng.integers(0, 256, (len(labels), size, size, 3), dtype=np.uint8)
        for c in CORRUPTIONS[:n_domains]
    }
    return ArrayCorruptedDataset(arrays, labels, name="toy")


def entropy(labels: np.ndarray) -> float:
    p = np.bincount(labels, minlength=N_CLASSES) / len(labels)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def n_domains_in(batch: np.ndarray) -> int:
    return len(np.unique(batch[:, 1]))


@pytest.fixture(scope="module")
def dataset():
    return make_dataset()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_sample_appears_as_often_as_the_scenario_says(dataset, scenario):
    rounds = 2
    stream = make_stream(dataset, n_domains=3, scenario=scenario, batch_size=16, rounds=rounds)
    counts = Counter(map(tuple, np.concatenate(stream.plan).tolist()))
    expected = {(r, d): APPEARANCES[scenario] * rounds for r in range(len(dataset)) for d in range(3)}
    assert counts == expected
    assert stream.n_samples == sum(expected.values())
    assert [d.corruption for d in stream.domains] == list(CORRUPTIONS[:3])


def test_continual_batches_hold_one_domain_in_order(dataset):
    stream = make_stream(dataset, n_domains=3, scenario="continual", batch_size=16)
    domains = [int(b[0, 1]) for b in stream.plan]
    assert all(n_domains_in(b) == 1 for b in stream.plan)
    assert domains == sorted(domains) and set(domains) == {0, 1, 2}


def test_crossmix_batches_mix_domains(dataset):
    stream = make_stream(dataset, n_domains=3, scenario="crossmix", batch_size=16)
    full = [b for b in stream.plan if len(b) == 16]
    assert all(n_domains_in(b) >= 2 for b in full)


def test_shuffle_alternates_continual_batches_in_order_with_mixed_ones(dataset):
    stream = make_stream(dataset, n_domains=3, scenario="shuffle", batch_size=16)
    n_mixed = len(make_stream(dataset, n_domains=3, scenario="crossmix", batch_size=16))
    head = stream.plan[: 2 * n_mixed]
    single = head[0::2] + stream.plan[2 * n_mixed :]
    mixed = head[1::2]
    assert all(n_domains_in(b) == 1 for b in single)
    order = [int(b[0, 1]) for b in single]
    assert order == sorted(order)
    assert all(n_domains_in(b) >= 2 for b in mixed if len(b) == 16)
    # the single-domain batches, concatenated, visit every sample of every domain once
    assert len({tuple(p) for p in np.concatenate(single).tolist()}) == 3 * len(dataset)


def test_random_puts_single_and_mixed_batches_in_random_order(dataset):
    stream = make_stream(dataset, n_domains=3, scenario="random", batch_size=16)
    single = [i for i, b in enumerate(stream.plan) if n_domains_in(b) == 1 and len(b) == 16]
    n_continual = len(make_stream(dataset, n_domains=3, scenario="continual", batch_size=16))
    assert len(single) >= n_continual - 3  # the full continual batches (plus rare pure crossmix)
    assert single != list(range(0, 2 * len(single), 2))  # not the interleaved shuffle order
    assert single != list(range(len(single)))  # not all the continual batches first


@pytest.mark.parametrize("batch_size", [1, 7, 16, 1000])
def test_batches_have_the_asked_size_and_the_last_partial_batch_is_kept(dataset, batch_size):
    n = len(dataset)
    continual = make_stream(dataset, n_domains=3, scenario="continual", batch_size=batch_size)
    per_domain = [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else [])
    assert [len(b) for b in continual.plan] == 3 * per_domain
    crossmix = make_stream(dataset, n_domains=3, scenario="crossmix", batch_size=batch_size)
    m = 3 * n
    assert [len(b) for b in crossmix.plan] == (
        [batch_size] * (m // batch_size) + ([m % batch_size] if m % batch_size else [])
    )


def test_smaller_delta_gives_lower_per_batch_label_entropy():
    dataset = make_dataset(n_per_class=40)
    means = []
    for delta in (10.0, 0.1, 0.005):
        values = [
            entropy(dataset.labels[b[:, 0]])
            for seed in range(4)
            for b in make_stream(dataset, n_domains=3, scenario="wild", batch_size=16,
                                 delta=delta, seed=seed).plan
        ]
        means.append(np.mean(values))
    assert means[0] > means[1] > means[2]
    iid = np.mean([entropy(dataset.labels[b[:, 0]])
                   for b in make_stream(dataset, n_domains=3, scenario="random", batch_size=16).plan])
    assert iid > means[0]


def test_wild_label_shift_indexes_the_dataset_through_the_mixed_order():
    """Mixed batches of ``wild`` must be both domain-mixed and label-concentrated.

    Reordering positions of the mixed list as if they were dataset rows (the bug of one public
    benchmark) yields rows whose labels are unrelated to the Dirichlet chunks: entropy near i.i.d.
    """
    dataset = make_dataset(n_per_class=40)
    stream = make_stream(dataset, n_domains=3, scenario="wild", batch_size=16, delta=0.005, seed=3)
    mixed = [b for b in stream.plan if n_domains_in(b) >= 2 and len(b) == 16]
    assert len(mixed) >= len(stream.plan) // 2 - 2
    assert np.mean([entropy(dataset.labels[b[:, 0]]) for b in mixed]) < 0.5


@settings(max_examples=30, deadline=None)
@example(labels=[0] * 10, delta=100.0, seed=0)  # every chunk full before the empty classes
@given(
    labels=st.lists(st.integers(0, 4), min_size=10, max_size=200),
    delta=st.sampled_from([0.005, 0.1, 1.0, 100.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_label_shift_order_is_a_permutation(labels, delta, seed):
    labels = np.array(labels)
    order = label_shift_order(labels, delta, 5, np.random.default_rng(seed), min_chunk=0)
    assert sorted(order.tolist()) == list(range(len(labels)))


def test_label_shift_order_makes_class_runs():
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(N_CLASSES), 50))
    order = label_shift_order(labels, 0.005, N_CLASSES, np.random.default_rng(1))
    changes = np.count_nonzero(np.diff(labels[order]))
    assert changes < 3 * N_CLASSES  # i.i.d. order would change label ~450 times


def test_label_shift_order_rejects_bad_delta():
    with pytest.raises(ValueError, match="delta"):
        label_shift_order(np.zeros(10, int), 0.0, 2, np.random.default_rng(0))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_same_seed_same_stream_different_seed_different_order(dataset, scenario):
    a = make_stream(dataset, n_domains=3, scenario=scenario, batch_size=16, seed=1)
    b = make_stream(dataset, n_domains=3, scenario=scenario, batch_size=16, seed=1)
    c = make_stream(dataset, n_domains=3, scenario=scenario, batch_size=16, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a.plan, b.plan)) and len(a) == len(b)
    assert not np.array_equal(np.concatenate(a.plan), np.concatenate(c.plan))


def test_rounds_are_reshuffled_and_extend_the_one_round_stream(dataset):
    one = make_stream(dataset, n_domains=2, scenario="crossmix", batch_size=10, rounds=1)
    two = make_stream(dataset, n_domains=2, scenario="crossmix", batch_size=10, rounds=2)
    assert len(two) == 2 * len(one)
    first, second = np.concatenate(two.plan[: len(one)]), np.concatenate(two.plan[len(one):])
    assert np.array_equal(first, np.concatenate(one.plan))
    assert not np.array_equal(first, second)


def test_batches_gather_the_planned_images_labels_and_domains(dataset):
    stream = make_stream(dataset, n_domains=3, scenario="random", batch_size=16, seed=5)
    for index in (0, 3, len(stream) - 1):
        batch, pairs = stream[index], stream.plan[index]
        expected = np.stack([
            dataset.images(*stream.domains[d])[r] for r, d in pairs.tolist()
        ]).transpose(0, 3, 1, 2) / 255.0
        assert batch.x.dtype == torch.float32 and batch.x.is_contiguous()
        torch.testing.assert_close(batch.x, torch.from_numpy(expected).float())
        assert batch.y.dtype == torch.int64 and batch.domain.dtype == torch.int64
        assert batch.y.tolist() == dataset.labels[pairs[:, 0]].tolist()
        assert batch.domain.tolist() == pairs[:, 1].tolist()
    assert sum(len(b.y) for b in stream) == stream.n_samples


def test_n_samples_uses_the_same_rows_in_every_domain(dataset):
    stream = make_stream(dataset, n_domains=3, scenario="crossmix", n_samples=50, seed=4)
    pairs = np.concatenate(stream.plan)
    rows = [set(pairs[pairs[:, 1] == d, 0].tolist()) for d in range(3)]
    assert len(rows[0]) == 50 and rows[0] == rows[1] == rows[2]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"scenario": "mixed"}, ValueError, "scenario"),
        ({"scenario": "random", "delta": 0.1}, ValueError, "delta"),
        ({"scenario": "wild", "delta": -1.0}, ValueError, "delta"),
        ({"corruptions": ["fog"], "n_domains": 2}, ValueError, "either"),
        ({"n_domains": 16}, ValueError, "n_domains"),
        ({"corruptions": "fog"}, ValueError, "sequence"),
        ({"corruptions": ["fog"]}, FileNotFoundError, "fog"),
        ({"n_domains": 2, "severity": 3}, ValueError, "severity"),
        ({"n_domains": 2, "batch_size": 0}, ValueError, "batch_size"),
        ({"n_domains": 2, "rounds": 0}, ValueError, "rounds"),
        ({"n_domains": 2, "n_samples": 10_000}, ValueError, "n_samples"),
    ],
)
def test_bad_arguments_raise_naming_the_problem(dataset, kwargs, error, match):
    with pytest.raises(error, match=match):
        make_stream(dataset, **kwargs)
