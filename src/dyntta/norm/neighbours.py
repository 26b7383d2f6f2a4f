"""Nearest neighbours by the cosine similarity of instance means (beyond the DYN paper).

DYN groups a batch by LISC, FINCH's first partition: chains of first neighbours, whose sizes
follow the chains, not the domains. Here each sample instead takes its own ``n`` most similar
samples (itself included), under the same similarity LISC uses: a neighbourhood of fixed size
per sample rather than a partition.
"""

from __future__ import annotations

import torch

from dyntta.norm.lisc import unit_rows


def nearest_neighbours(pool: torch.Tensor, n: int, queries: int) -> torch.Tensor:
    """Indices into ``pool`` of the ``min(n, P)`` rows most cosine-similar to each of its last
    ``queries`` rows (the batch, after the window).

    Each query finds itself first (similarity 1), unless it is a zero row or an exact duplicate
    of another.

    Args:
        pool: (P, D); n >= 1; 1 <= queries <= P.

    Returns:
        (queries, min(n, P)) int64, most similar first.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 1 <= queries <= pool.shape[0]:
        raise ValueError(f"queries must be in 1..{pool.shape[0]} (the pool's rows), got {queries}")
    unit = unit_rows(pool)
    similarity = unit[-queries:] @ unit.T
    return similarity.topk(min(n, pool.shape[0]), dim=1).indices


def widest_consistent(
    pool_mean: torch.Tensor, pool_var: torch.Tensor, queries: int, smallest: int, z: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each query's neighbourhood widened while its mean stays within the noise of every
    narrower one (Lepski's rule, Lepski 1991; Goldenshluger and Nemirovski 1997).

    Candidate sizes ``smallest, 2 * smallest, ...`` and the pool's P rows, each the most
    cosine-similar rows (the query included). The widest size ``n_k`` is taken whose mean
    ``m_k`` of the instance means stays, against every narrower ``n_j``, within
    ``mean_c (m_k - m_j)^2 / (d_k / n_j) <= 1 + z * sqrt(2 / C)``: ``d_k / n_j`` is the squared
    standard error of ``m_j`` with ``d_k`` the spread of the instance means in the wider
    neighbourhood (a narrow neighbourhood's own spread is shrunk by its selection), and the
    bound is a chi-square over C channels, divided by C, at ``z`` standard deviations above its
    mean. A batch of one distribution widens far; a mixture stops at its components.

    Args:
        pool_mean, pool_var: (P, C) instance means and variances; the queries last.
        queries: 1 <= B <= P.
        smallest: the narrowest size, >= 1.
        z: the acceptance band in standard deviations of that chi-square, >= 0.

    Returns:
        ``(m, v, d, n)``: (B, C) mean, variance (law of total variance) and spread of each
        query's chosen neighbourhood, and (B, 1) its size.
    """
    p, c = pool_mean.shape
    unit = unit_rows(pool_mean)
    order = (unit[-queries:] @ unit.T).argsort(dim=1, descending=True)
    members = pool_mean[order]  # (B, P, C), most similar first
    first = members.cumsum(1)
    second = members.square().cumsum(1)
    within = pool_var[order].cumsum(1)
    sizes = [n for n in (smallest * 2 ** k for k in range(p.bit_length())) if n < p] + [p]
    count = torch.tensor(sizes, dtype=pool_mean.dtype, device=pool_mean.device)[None, :, None]
    rows = torch.tensor([n - 1 for n in sizes], device=pool_mean.device)
    mean = first[:, rows] / count  # (B, K, C)
    spread = (second[:, rows] / count - mean.square()).clamp_min(0.0)
    var = within[:, rows] / count + spread
    tiny = torch.finfo(pool_mean.dtype).tiny
    # distance[b, j, k]: mean over channels of (m_k - m_j)^2 / (d_k / n_j): the wider
    # neighbourhood's spread (a narrow one's is shrunk by the selection itself)
    se2 = (spread[:, None] / count[:, :, None]).clamp_min(tiny)
    distance = ((mean[:, None] - mean[:, :, None]).square() / se2).mean(-1)
    narrower = torch.ones(len(sizes), len(sizes), dtype=torch.bool,
                          device=pool_mean.device).triu(1)
    bound = 1.0 + z * (2.0 / c) ** 0.5
    consistent = ((distance <= bound) | ~narrower).all(1)  # (B, K)
    chosen = consistent.to(torch.int64).cumprod(1).sum(1).clamp_min(1) - 1  # (B,)
    pick = chosen[:, None, None].expand(-1, 1, c)
    size = count[0, :, 0][chosen][:, None]
    return (mean.gather(1, pick)[:, 0], var.gather(1, pick)[:, 0],
            spread.gather(1, pick)[:, 0], size)
