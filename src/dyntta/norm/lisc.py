"""LISC: layer-wise instance statistics clustering, the first partition of FINCH.

Sarfraz et al., "Efficient Parameter-free Clustering Using First Neighbor Relations", CVPR 2019:
each sample's first neighbour is its most similar other sample; samples i and j are linked when
``n_i = j``, ``n_j = i`` or ``n_i = n_j``; clusters are the connected components.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def unit_rows(features: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit length; a zero row stays zero (cosine similarity 0 with every row)."""
    return features / torch.linalg.vector_norm(features, dim=1, keepdim=True).clamp_min(1e-12)


def same_cluster(labels: torch.Tensor) -> torch.Tensor:
    """(N, N) bool: which pairs of samples share a cluster, for (N,) labels of any values."""
    return labels[:, None] == labels[None, :]


def first_neighbours(features: torch.Tensor) -> torch.Tensor:
    """Index of each row's most cosine-similar other row (ties to the lowest index).

    A zero row has cosine similarity 0 with every row (as in scikit-learn's cosine distance).
    The similarity matrix is symmetrised exactly, so ``i -> j -> i`` cycles are the only cycles.

    Args:
        features: (B, D) with B >= 2.

    Returns:
        (B,) int64 neighbour indices, never equal to the row's own index.
    """
    unit = unit_rows(features)
    sim = unit @ unit.T
    sim = sim + sim.T  # twice the cosine similarity, bit-for-bit symmetric
    sim.fill_diagonal_(float("-inf"))
    return sim.argmax(dim=1)


def pointer_jumping(neighbours: torch.Tensor) -> torch.Tensor:
    """Name each connected component of the first-neighbour graph by one of its members.

    Every component of a nearest-neighbour graph (with a consistent tie-break) holds exactly one
    cycle, a mutual pair ``i <-> n_i``. Pointer jumping (``p <- p[p]``, k times: ``p = n^(2^k)``)
    moves every sample onto its component's pair once ``2^k`` reaches its distance from the pair,
    at most B - 2; the smaller index of the pair names the component. Here k = ceil(log2 B).
    On the CPU the rounds index numpy views of the tensors (no copy): about 1 us a round against
    about 5 us for a torch call on a 64-sample batch.

    Args:
        neighbours: (B,) int64 first-neighbour indices.

    Returns:
        (B,) int64 ids in 0..B-1, equal exactly for samples of the same component.
    """
    on_cpu = neighbours.device.type == "cpu"
    first = neighbours.numpy() if on_cpu else neighbours
    pointer = first
    for _ in range(max(1, math.ceil(math.log2(first.shape[0])))):
        pointer = pointer[pointer]
    if on_cpu:
        return torch.from_numpy(np.minimum(pointer, first[pointer]))
    return torch.minimum(pointer, first[pointer])


def lisc_ids(mu: torch.Tensor) -> torch.Tensor:
    """(B,) component ids of the first-neighbour graph of ``mu: (B, C)``, B >= 2 (no relabelling).
    """
    return pointer_jumping(first_neighbours(mu))


traced_lisc_ids = torch.library.custom_op("dyntta::lisc_ids", mutates_args=())(lisc_ids)
""":func:`lisc_ids` as one operator in a ``torch.compile`` graph: no kernel for inductor to
generate for the similarity, the first neighbours or the pointer-jumping rounds."""


@traced_lisc_ids.register_fake
def _(mu: torch.Tensor) -> torch.Tensor:
    return mu.new_empty(mu.shape[0], dtype=torch.long)


def canonical_labels(ids: torch.Tensor) -> torch.Tensor:
    """Relabel cluster ids to 0..K-1 in order of first appearance (sample 0 is in cluster 0)."""
    same = same_cluster(ids)
    first_member = same.to(torch.uint8).argmax(dim=1)  # lowest index of each sample's cluster
    is_first = first_member == torch.arange(ids.shape[0], device=ids.device)
    return (is_first.cumsum(0) - 1).gather(0, first_member)


def lisc(mu: torch.Tensor, canonical: bool = True) -> torch.Tensor:
    """Cluster the samples of a batch by the cosine similarity of their instance means.

    Args:
        mu: (B, C) per-sample channel means of one BN layer's input.
        canonical: label the clusters 0..K-1 in order of first appearance. ``False`` skips that
            relabelling (a few small ops per layer, the CABN hot path's default): the labels are
            then ids in 0..B-1 that are equal exactly within a cluster.

    Returns:
        (B,) int64 cluster labels. B = 1 gives one cluster.
    """
    if mu.ndim != 2:
        raise ValueError(f"lisc expects mu of shape (B, C), got {tuple(mu.shape)}")
    if mu.shape[0] == 1:
        return torch.zeros(1, dtype=torch.long, device=mu.device)
    ids = traced_lisc_ids(mu) if torch.compiler.is_compiling() else lisc_ids(mu)
    return canonical_labels(ids) if canonical else ids
