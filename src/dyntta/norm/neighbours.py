"""Nearest neighbours by the cosine similarity of instance means (beyond the DYN paper).

DYN groups a batch by LISC, FINCH's first partition: chains of first neighbours, whose sizes
follow the chains, not the domains. Here each sample instead takes its own ``n`` most similar
samples (itself included), under the same similarity LISC uses: a neighbourhood of fixed size
per sample rather than a partition.
"""

from __future__ import annotations

import torch

from dyntta.norm.lisc import unit_rows
from dyntta.norm.stats import rows


def nearest_neighbours(pool: torch.Tensor, n: int, queries: int,
                       candidates: torch.Tensor | None = None) -> torch.Tensor:
    """Indices into ``pool`` of the ``min(n, P)`` rows most cosine-similar to each of its last
    ``queries`` rows (the batch, after the window); with ``candidates``, of the ``min(n, K)``
    most similar among each query's K candidate rows.

    Each query finds itself first (similarity 1), unless it is a zero row or an exact duplicate
    of another (or, with candidates, not among its own).

    Args:
        pool: (P, D); n >= 1; 1 <= queries <= P.
        candidates: None (every row), or (queries, K) indices into ``pool``.

    Returns:
        (queries, min(n, P or K)) int64, most similar first.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 1 <= queries <= pool.shape[0]:
        raise ValueError(f"queries must be in 1..{pool.shape[0]} (the pool's rows), got {queries}")
    unit = unit_rows(pool)
    if candidates is None:
        similarity = unit[-queries:] @ unit.T
        return similarity.topk(min(n, pool.shape[0]), dim=1).indices
    # (queries, K): each query's similarity to its candidates
    similarity = torch.bmm(rows(unit, candidates), unit[-queries:, :, None])[:, :, 0]
    return candidates.gather(1, similarity.topk(min(n, candidates.shape[1]), dim=1).indices)
