"""Nearest neighbours by the cosine similarity of instance means (beyond the DYN paper).

DYN groups a batch by LISC, FINCH's first partition: chains of first neighbours, whose sizes
follow the chains, not the domains. Here each sample instead takes its own ``n`` most similar
samples (itself included), under the same similarity LISC uses: a neighbourhood of fixed size
per sample rather than a partition.
"""

from __future__ import annotations

import torch

from dyntta.norm.lisc import unit_rows


def nearest_neighbours(queries: torch.Tensor, pool: torch.Tensor, n: int) -> torch.Tensor:
    """Indices into ``pool`` of each query's ``min(n, P)`` most cosine-similar rows.

    A query that is itself a row of ``pool`` finds itself first (similarity 1), unless it is a
    zero row or an exact duplicate of another.

    Args:
        queries: (B, D); pool: (P, D); n >= 1.

    Returns:
        (B, min(n, P)) int64, most similar first.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    similarity = unit_rows(queries) @ unit_rows(pool).T
    return similarity.topk(min(n, pool.shape[0]), dim=1).indices
