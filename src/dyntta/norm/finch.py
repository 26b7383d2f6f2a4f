"""FINCH's next partition level, to merge the clusters LISC over-splits.

Sarfraz et al., "Efficient Parameter-free Clustering Using First Neighbor Relations", CVPR 2019,
Sec. 3.1: the next level treats each cluster of the current partition as one point (its mean),
links every cluster to its most cosine-similar other cluster, and takes the connected components.
Each level at least halves the number of clusters (until one remains). DYN uses the first level
only; on 64 clean images of one domain it makes about 14 clusters of 4-5 samples.
"""

from __future__ import annotations

import torch

from dyntta.norm.lisc import component_roots, same_cluster


def next_level(mu: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Merge every cluster with its first neighbour among the other clusters' means.

    Vectorised: each cluster is represented by its lowest sample index; the (N, N) cosine
    similarity of the cluster means is read at the representatives, so rows and columns of one
    cluster are bit-identical and exactly symmetric, and every sample's first neighbour is the
    representative of its cluster's nearest cluster. That is again a first-neighbour graph, whose
    components :func:`~dyntta.norm.lisc.component_roots` names by pointer jumping.

    Args:
        mu: (N, C) the samples' instance means (the features LISC clustered).
        labels: (N,) current cluster labels (equal exactly within a cluster, any values).

    Returns:
        (N,) int64 ids of the coarser partition, equal exactly within a cluster. A partition
        with one cluster is returned as one cluster.
    """
    same = same_cluster(labels)
    rep = same.to(torch.uint8).argmax(dim=1)  # lowest member index of each sample's cluster
    members = same.to(mu.dtype)
    centres = (members / members.sum(1, keepdim=True)) @ mu
    unit = centres / torch.linalg.vector_norm(centres, dim=1, keepdim=True).clamp_min(1e-12)
    sim = unit @ unit.T
    sim = (sim + sim.T)[rep][:, rep].masked_fill(same, float("-inf"))
    neighbour = sim.argmax(dim=1)  # the nearest other cluster's representative
    alone = same.all(dim=1)  # one cluster only: it stays as it is
    return component_roots(torch.where(alone, rep, neighbour))
