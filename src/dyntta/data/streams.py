"""Dynamic test streams: batches (x, y, domain) over corrupted domains, reproducible from a seed.

A stream is planned first (which dataset row of which domain goes into which batch; a few
integers per sample) and images are gathered batch by batch when iterated, so ImageNet-C-sized
streams fit in memory. A sample is a pair (row, domain): ``dataset.images(*domains[domain])[row]``
with label ``dataset.labels[row]``.

Scenarios (DYN, Jiang et al. 2024, "Discover Your Neighbours: Advanced Stable Test-Time
Adaptation in Dynamic World"; the authors' released TTAB-based code: ``inter_domain`` =
HomogeneousNoMixture / CrossMixture / BatchMixing in ``ttab/loads/define_dataset.py`` and
``SpecialMergeMultiDataset`` in ``ttab/loads/datasets/datasets.py``):

- ``continual``: the domains one after another, each shuffled (HomogeneousNoMixture with
  ``intra_domain_shuffle=True``) and cut into batches on its own: every batch holds one domain.
- ``crossmix``: all samples of all domains pooled and shuffled (CrossMixture): batches mix domains.
- ``random``: the continual and the crossmix streams over the same samples, each cut into
  batches, all those batches in random order (BatchMixing "Homo&Cross", ``sp_order``
  "Shuffle_Shuffle"). Every sample appears twice per round.
- ``shuffle``: the continual stream's batches in order with one crossmix batch after each while
  they last (BatchMixing "Homo&Cross", ``sp_order`` "Interval_Seq"). Every sample appears twice
  per round.
- ``wild``: ``random`` with label shift: within each domain of the continual stream and within
  the pooled crossmix stream, samples are reordered into NOTE's Dirichlet class chunks
  (:func:`label_shift_order`, concentration ``delta``; the paper uses 0.1, 0.01 and 0.005).

Differences from the released code, on purpose: partial batches are kept (the code drops them
when interleaving); each domain of the continual stream is cut on its own, so no batch straddles
two domains (the code cuts the concatenated domains, and ``shuffle`` then has as many continual
as crossmix batches; here the extra continual batches, one per domain at most, come last); and
the label-shift order indexes the dataset through the already mixed
order (TTAB's ``_intra_non_iid_shift`` writes the positions within the mixed list back as dataset
indices, which undoes the mixing; DYN's ``_intra_non_iid_shift2`` maps them correctly, as here).
"""

from __future__ import annotations

import collections
import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np
import torch

from dyntta.data.corruptions import CORRUPTIONS
from dyntta.data.datasets import CorruptedDataset, LazyImageFiles, to_tensor

DEFAULT_DELTA = 0.01
"""Dirichlet concentration of ``wild`` when none is given: ``--non_iid_ness`` default (0.01) of the
DYN code's ``parameters.py``."""

MIN_CHUNK = 1
"""Smallest Dirichlet chunk accepted (DYN's ``_intra_non_iid_shift2``: 1; TTAB/NOTE use 5)."""

MAX_ATTEMPTS = 1000

LAZY_PREFETCH = 2
"""Batches decoded ahead in background threads when images are decoded on read (ImageNet-C's
JPEG files) and no ``prefetch`` is given; memory-mapped and in-memory sets read fast enough
in the consumer's thread (0)."""


class Domain(NamedTuple):
    """One test domain: a corruption at a severity."""

    corruption: str
    severity: int


class Batch(NamedTuple):
    """One batch: images ``x`` (B, 3, H, W) float32 in [0, 1], labels ``y`` (B,) int64 and
    ``domain`` (B,) int64, an index into the stream's ``domains``."""

    x: torch.Tensor
    y: torch.Tensor
    domain: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Pool:
    """What a scenario plans over: the same dataset ``rows`` in each of ``n_domains`` domains."""

    rows: np.ndarray
    n_domains: int
    labels: np.ndarray
    num_classes: int
    batch_size: int
    delta: float | None


def label_shift_order(
    labels: np.ndarray,
    delta: float,
    num_classes: int,
    rng: np.random.Generator,
    min_chunk: int = MIN_CHUNK,
) -> np.ndarray:
    """A permutation of ``range(len(labels))`` that orders samples into Dirichlet class chunks.

    NOTE's non-i.i.d. sampling (Gong et al., NeurIPS 2022; as in TTAB's ``_intra_non_iid_shift``):
    with K = ``num_classes`` chunks, each class's samples are shuffled and split among the chunks
    in proportions drawn from Dir(delta * 1_K), chunks already holding >= M / K samples get no
    more; the draw is repeated until every chunk holds >= ``min_chunk`` samples. The order is the
    chunks one after another, inside each chunk its classes in random order. Smaller ``delta``
    gives longer single-class runs.

    If every chunk still open gets proportion exactly 0 (Dirichlet samples underflow for tiny
    ``delta``; the reference code then divides by zero), that class's proportions are drawn again.

    Returns positions into ``labels``; apply them to the sequence ``labels`` came from.
    """
    if not delta > 0:
        raise ValueError(f"delta (Dirichlet concentration) must be > 0, got {delta}")
    labels = np.asarray(labels)
    m = len(labels)
    by_class = [np.flatnonzero(labels == k) for k in range(num_classes)]
    for _ in range(MAX_ATTEMPTS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_classes)]
        sizes = np.zeros(num_classes, dtype=np.int64)
        for members in by_class:
            members = rng.permutation(members)
            open_chunks = sizes < m / num_classes
            if not open_chunks.any():  # then sizes sum to >= m: every sample is placed, and this
                for part in parts:     # class is empty (a draw would be all zeros forever)
                    part.append(members)
                continue
            for _ in range(MAX_ATTEMPTS):
                proportions = rng.dirichlet(np.full(num_classes, delta)) * open_chunks
                if proportions.sum() > 0:
                    break
            else:
                raise ValueError(f"Dirichlet proportions underflow to 0 for delta={delta}; use a larger delta")
            cuts = (np.cumsum(proportions / proportions.sum()) * len(members)).astype(int)[:-1]
            for chunk, piece in enumerate(np.split(members, cuts)):
                parts[chunk].append(piece)
                sizes[chunk] += len(piece)
        if sizes.min() >= min_chunk:
            break
    else:
        raise ValueError(
            f"no Dirichlet split of {m} samples into {num_classes} chunks of >= {min_chunk} "
            f"after {MAX_ATTEMPTS} draws (delta={delta}); use more samples or a larger delta"
        )
    order = [parts[chunk][k] for chunk in range(num_classes) for k in rng.permutation(num_classes)]
    return np.concatenate(order)


def _pairs(rows: np.ndarray, domain: int) -> np.ndarray:
    return np.stack([rows, np.full_like(rows, domain)], axis=1)


def _continual_blocks(pool: Pool, rng: np.random.Generator, label_shift: bool) -> list[np.ndarray]:
    """One shuffled (or label-shift ordered) block of (row, domain) pairs per domain, in order."""
    blocks = []
    for d in range(pool.n_domains):
        rows = rng.permutation(pool.rows)
        if label_shift:
            rows = rows[label_shift_order(pool.labels[rows], pool.delta, pool.num_classes, rng)]
        blocks.append(_pairs(rows, d))
    return blocks


def _crossmix_order(pool: Pool, rng: np.random.Generator, label_shift: bool) -> np.ndarray:
    pairs = np.concatenate([_pairs(pool.rows, d) for d in range(pool.n_domains)])
    pairs = pairs[rng.permutation(len(pairs))]
    if label_shift:
        pairs = pairs[label_shift_order(pool.labels[pairs[:, 0]], pool.delta, pool.num_classes, rng)]
    return pairs


def _cut(order: np.ndarray, batch_size: int) -> list[np.ndarray]:
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _cut_blocks(blocks: list[np.ndarray], batch_size: int) -> list[np.ndarray]:
    """Cut every block on its own, so that no batch straddles two domains."""
    return [batch for block in blocks for batch in _cut(block, batch_size)]


def _interleave(first: list[np.ndarray], second: list[np.ndarray]) -> list[np.ndarray]:
    """first[0], second[0], first[1], second[1], ...; the longer list's extra batches at the end."""
    n = min(len(first), len(second))
    paired = [batch for pair in zip(first[:n], second[:n]) for batch in pair]
    return paired + first[n:] + second[n:]


def _in_random_order(batches: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    return [batches[i] for i in rng.permutation(len(batches))]


def plan_continual(pool: Pool, rng: np.random.Generator) -> list[np.ndarray]:
    """Domains one after another, each shuffled and cut on its own: single-domain batches."""
    return _cut_blocks(_continual_blocks(pool, rng, False), pool.batch_size)


def plan_crossmix(pool: Pool, rng: np.random.Generator) -> list[np.ndarray]:
    """All samples of all domains pooled and shuffled: mixed batches."""
    return _cut(_crossmix_order(pool, rng, False), pool.batch_size)


def plan_random(pool: Pool, rng: np.random.Generator) -> list[np.ndarray]:
    """The continual and the crossmix batches together, in random order."""
    batches = plan_continual(pool, rng) + plan_crossmix(pool, rng)
    return _in_random_order(batches, rng)


def plan_shuffle(pool: Pool, rng: np.random.Generator) -> list[np.ndarray]:
    """The continual batches in order, each followed by one crossmix batch while they last."""
    return _interleave(plan_continual(pool, rng), plan_crossmix(pool, rng))


def plan_wild(pool: Pool, rng: np.random.Generator) -> list[np.ndarray]:
    """``random`` with Dirichlet label shift inside the continual and the crossmix streams."""
    single = _cut_blocks(_continual_blocks(pool, rng, True), pool.batch_size)
    mixed = _cut(_crossmix_order(pool, rng, True), pool.batch_size)
    return _in_random_order(single + mixed, rng)


PLANNERS: dict[str, Callable[[Pool, np.random.Generator], list[np.ndarray]]] = {
    "continual": plan_continual,
    "crossmix": plan_crossmix,
    "random": plan_random,
    "shuffle": plan_shuffle,
    "wild": plan_wild,
}
SCENARIOS = tuple(PLANNERS)
APPEARANCES = {"continual": 1, "crossmix": 1, "random": 2, "shuffle": 2, "wild": 2}
"""How often each (row, domain) sample appears per round."""


class Stream:
    """A planned stream: ``len(stream)`` batches, iterated as :class:`Batch` es.

    Attributes:
        dataset: the :class:`CorruptedDataset` the images come from.
        domains: tuple of :class:`Domain`; ``Batch.domain`` indexes it.
        plan: tuple of (B_i, 2) int64 arrays, one per batch, columns (dataset row, domain index).
        scenario, batch_size, rounds, seed, delta: how the plan was made.
        prefetch: batches gathered (decoded) ahead of the consumer by as many background
            threads while iterating; 0 gathers each batch when asked. At most ``prefetch + 1``
            batches are held. Batches are identical either way.
    """

    def __init__(
        self,
        dataset: CorruptedDataset,
        domains: Sequence[Domain],
        plan: Sequence[np.ndarray],
        scenario: str,
        batch_size: int,
        rounds: int,
        seed: int,
        delta: float | None,
        prefetch: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.domains = tuple(domains)
        self.plan = tuple(plan)
        self.scenario = scenario
        self.batch_size = batch_size
        self.rounds = rounds
        self.seed = seed
        self.delta = delta
        self._images = [dataset.images(d.corruption, d.severity) for d in self.domains]
        shapes = {tuple(images.shape[1:]) for images in self._images}
        if len(shapes) != 1:
            raise ValueError(f"domains of {dataset.name} have different image shapes: {sorted(shapes)}")
        if prefetch is None:
            lazy = any(isinstance(images, LazyImageFiles) for images in self._images)
            prefetch = LAZY_PREFETCH if lazy else 0
        if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0 (batches decoded ahead), got {prefetch!r}")
        self.prefetch = int(prefetch)

    def __len__(self) -> int:
        return len(self.plan)

    def __repr__(self) -> str:
        return (
            f"Stream({self.scenario!r}, {len(self.domains)} domains, {len(self)} batches of "
            f"{self.batch_size}, rounds={self.rounds}, seed={self.seed})"
        )

    @property
    def n_samples(self) -> int:
        """Number of samples over all batches."""
        return sum(len(b) for b in self.plan)

    def __getitem__(self, index: int) -> Batch:
        pairs = self.plan[index]
        rows, domains = pairs[:, 0], pairs[:, 1]
        x = np.empty((len(rows), *self._images[0].shape[1:]), dtype=np.uint8)
        for d in np.unique(domains):
            where = np.flatnonzero(domains == d)
            x[where] = self._images[d][rows[where]]
        return Batch(
            x=to_tensor(x).contiguous(),
            y=torch.from_numpy(self.dataset.labels[rows]),
            domain=torch.from_numpy(domains.copy()),
        )

    def __iter__(self) -> Iterator[Batch]:
        if self.prefetch == 0:
            for index in range(len(self)):
                yield self[index]
            return
        # Workers read, decode (PIL releases the GIL) and convert whole batches.
        pool = ThreadPoolExecutor(self.prefetch, thread_name_prefix="dyntta-prefetch")
        pending: collections.deque[Future] = collections.deque()
        try:
            for index in range(len(self)):
                while len(pending) < self.prefetch + 1 and index + len(pending) < len(self):
                    pending.append(pool.submit(self.__getitem__, index + len(pending)))
                yield pending.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

def make_stream(
    dataset: CorruptedDataset,
    corruptions: Sequence[str] | None = None,
    n_domains: int | None = None,
    severity: int = 5,
    scenario: str = "crossmix",
    batch_size: int = 64,
    rounds: int = 1,
    seed: int = 0,
    delta: float | None = None,
    n_samples: int | None = None,
    prefetch: int | None = None,
) -> Stream:
    """Plan a dynamic test stream over corrupted domains of ``dataset``.

    Args:
        dataset: a :class:`CorruptedDataset` (e.g. from :func:`load_corrupted`).
        corruptions: the corruption names, in stream order. Give this or ``n_domains``; with
            neither, all 15 standard corruptions.
        n_domains: use the first ``n_domains`` of :data:`CORRUPTIONS` (the paper uses 6, 9, 12, 15).
        severity: severity 1..5 of every domain (default 5, as in the paper).
        scenario: one of :data:`SCENARIOS` (see the module docstring).
        batch_size: samples per batch, >= 1; the last batch of each sub-stream may be smaller.
        rounds: the stream repeated ``rounds`` times, re-planned each round (life-long adaptation).
        seed: the same seed gives the same stream; each round draws from its own child seed.
        delta: Dirichlet concentration of ``wild`` (default 0.01); an error for other scenarios.
        n_samples: use this many dataset rows (drawn once from ``seed``, the same rows in every
            domain and round); default all rows.
        prefetch: batches decoded ahead in background threads while iterating (see
            :class:`Stream`); default :data:`LAZY_PREFETCH` for sets decoded on read
            (ImageNet-C's JPEGs), else 0. Does not change the batches.
    """
    if scenario not in PLANNERS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {', '.join(SCENARIOS)}")
    names = _domain_names(corruptions, n_domains)
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)):
        raise ValueError(f"severity must be an int in 1..5, got {severity!r}")
    for value, what in ((batch_size, "batch_size"), (rounds, "rounds")):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{what} must be an int >= 1, got {value!r}")
    if scenario == "wild":
        delta = DEFAULT_DELTA if delta is None else float(delta)
        if not delta > 0:
            raise ValueError(f"delta must be > 0, got {delta}")
    elif delta is not None:
        raise ValueError(f"delta (label shift) applies to scenario 'wild' only, not {scenario!r}")
    domains = [Domain(name, int(severity)) for name in names]
    for d in domains:
        dataset.images(d.corruption, d.severity)  # raises if the domain is not in the dataset

    children = np.random.SeedSequence(seed).spawn(rounds + 1)
    rows = _choose_rows(len(dataset), n_samples, np.random.default_rng(children[0]))
    pool = Pool(rows, len(domains), dataset.labels, dataset.num_classes, int(batch_size), delta)
    plan = [
        batch
        for child in children[1:]
        for batch in PLANNERS[scenario](pool, np.random.default_rng(child))
    ]
    return Stream(dataset, domains, plan, scenario, int(batch_size), int(rounds), seed, delta,
                  prefetch)


def _domain_names(corruptions: Sequence[str] | None, n_domains: int | None) -> list[str]:
    if corruptions is not None and n_domains is not None:
        raise ValueError("give either corruptions or n_domains, not both")
    if n_domains is not None:
        if isinstance(n_domains, bool) or not 1 <= n_domains <= len(CORRUPTIONS):
            raise ValueError(f"n_domains must be in 1..{len(CORRUPTIONS)}, got {n_domains!r}")
        return list(CORRUPTIONS[:n_domains])
    if corruptions is None:
        return list(CORRUPTIONS)
    if isinstance(corruptions, str):
        raise ValueError(f"corruptions must be a sequence of names, got the string {corruptions!r}")
    names = list(corruptions)
    if not names:
        raise ValueError("corruptions must name at least one corruption")
    if len(set(names)) != len(names):
        raise ValueError(f"corruptions must not repeat a name, got {names}")
    return names


def _choose_rows(n: int, n_samples: int | None, rng: np.random.Generator) -> np.ndarray:
    if n_samples is None:
        return np.arange(n, dtype=np.int64)
    if isinstance(n_samples, bool) or not 1 <= n_samples <= n:
        raise ValueError(f"n_samples must be in 1..{n} (the dataset size), got {n_samples!r}")
    return np.sort(rng.choice(n, size=n_samples, replace=False)).astype(np.int64)
