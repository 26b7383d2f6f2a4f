"""Per-sample, per-batch and per-cluster statistics of a BN layer's input.

All functions are pure tensor code on the input's device: no loop over samples or clusters and
no host round trip.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from dyntta.norm.lisc import same_cluster


def rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for a (P, C) ``table`` and an int64 ``index`` of any shape: the same
    values, gathered as an embedding look-up (on the CPU, one thread, P = 256, C = 16 to 64:
    3-4x faster than advanced indexing for (64, 8) indices, 5-6x for (64, 32))."""
    return F.embedding(index, table)


def instance_stats(x: torch.Tensor, unbiased: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Channel mean and variance of every sample over its spatial positions.

    One read of ``x`` for the mean and one for the sum of squares (``vector_norm``), with no
    (B, C, H, W) temporary: ``var = E[x^2] - mean^2``, clamped at 0. On CPU this is 8-12x faster
    than the two-pass ``E[(x - mean)^2]`` on large maps and as fast on small ones
    (``benchmarks/norm_layer_overhead.py``). Its rounding error relative to ``var`` grows like
    ``eps * (1 + mean^2 / var)``: in float32 about 1e-6 at |mean| / std = 3, 1e-3 only at
    |mean| / std ~ 100. In the real CIFAR-10 ResNet-20's BN inputs the median |mean| / std per
    layer is 0.45-1.79 and the largest 12.0 (``benchmarks/bn_input_ratios.py``).

    Args:
        x: (B, C, H, W) features.
        unbiased: divide the variance by H*W - 1 (as ``torch.var_mean(unbiased=True)`` in the DYN
            authors' code) instead of H*W. A 1x1 feature map has no spread: its variance is 0.

    Returns:
        ``(mean, var)``, each (B, C).
    """
    n = x.shape[2] * x.shape[3]
    mean = x.mean(dim=(2, 3))
    sum_square = torch.linalg.vector_norm(x, dim=(2, 3)).square()
    spread = torch.addcmul(sum_square, mean, mean, value=-n).clamp_min(0.0)  # n * biased var
    return mean, spread / (n - 1 if unbiased and n > 1 else n)


def batch_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Channel mean and (biased) variance over batch and space, as BN in training mode uses.

    Computed from the instance statistics by the law of total variance.

    Args:
        x: (B, C, H, W).

    Returns:
        ``(mean, var)``, each (C,).
    """
    inst_mean, inst_var = instance_stats(x, unbiased=False)
    mean = inst_mean.mean(0)
    return mean, inst_var.mean(0) + (inst_mean - mean).square().mean(0)


def cluster_stats(
    mean: torch.Tensor, var: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Statistics of each sample's cluster, from the samples' instance statistics.

    For cluster k with members S_k: ``mu_k = mean_{i in S_k} mu_i`` and, by the law of total
    variance, ``s2_k = mean_{i in S_k} s2_i + mean_{i in S_k} (mu_i - mu_k)^2``. Both are one
    (B, B) @ (B, C) product with the row-normalised same-cluster matrix.

    Args:
        mean, var: (B, C) instance statistics.
        labels: (B,) integer cluster labels; equal labels mean the same cluster (any values).

    Returns:
        ``(mu, s2)``, each (B, C): row i holds the statistics of sample i's cluster.
    """
    same = same_cluster(labels).to(mean.dtype)
    average = same / same.sum(1, keepdim=True)
    cluster_mean = average @ mean
    return cluster_mean, average @ (var + (mean - cluster_mean).square())


def neighbourhood_stats(
    mean: torch.Tensor, var: torch.Tensor, index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Statistics of each query's neighbourhood, from the pool's instance statistics.

    For query i with neighbours S_i (rows ``index[i]``): ``m_i = mean_{j in S_i} mu_j`` and, by
    the law of total variance, ``v_i = mean_{j in S_i} (s2_j + (mu_j - m_i)^2)``, whose second
    term ``d_i = mean_{j in S_i} (mu_j - m_i)^2`` is the spread of the instance means. Unlike
    :func:`cluster_stats`, neighbourhoods may overlap, so each is reduced on its own.

    Args:
        mean, var: (P, C) instance statistics of the pool.
        index: (B, n) int64 rows of the pool in each query's neighbourhood.

    Returns:
        ``(m, v, d)``, each (B, C).
    """
    members = rows(mean, index)  # (B, n, C)
    centre = members.mean(1)
    deviation = (members - centre[:, None]).square()
    return centre, (rows(var, index) + deviation).mean(1), deviation.mean(1)


def weighted_stats(
    mean: torch.Tensor, var: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`neighbourhood_stats` of B groups given as weights over the pool's rows, by matrix
    products instead of a (B, n, C) gather: ``m_i = sum_j w_ij mu_j``, ``d_i = sum_j w_ij
    (mu_j - m_i)^2`` and ``v_i = sum_j w_ij s2_j + d_i``, with the second moment taken about
    the pool's mean (which leaves ``d`` unchanged and keeps the difference of moments small).

    Args:
        mean, var: (P, C) instance statistics of the pool.
        weights: (B, P), each row non-negative and summing to 1.

    Returns:
        ``(m, v, d)``, each (B, C).
    """
    centre = mean.mean(0)
    shifted = mean - centre
    m = weights @ shifted
    spread = (weights @ shifted.square() - m.square()).clamp_min(0.0)
    return m + centre, weights @ var + spread, spread


def spread_ratio(spread: torch.Tensor, var: torch.Tensor, length: int, eps: float) -> torch.Tensor:
    """How much instance means vary, in units of the squared standard error IABN assumes.

    ``rho_c = sum_i spread_ic / sum_i ((var_ic + eps) / L)``: per channel, the mean of the
    samples' ``spread`` (e.g. the variance of instance means around each sample's group) over
    the mean of their squared standard errors ``(var + eps) / L``, which hold for independent
    positions. Near 1 where positions are independent and samples alike; large where
    neighbouring positions are correlated (the "design effect" of a feature map) or samples
    differ in content.

    Args:
        spread: (B, C) squared spread of the instance means around each sample's group.
        var: (B, C) instance variances over ``length = H*W`` positions.

    Returns:
        (C,): each channel's ratio.
    """
    return spread.sum(0) / ((var + eps).sum(0) / length)


def soft_shrink(d: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """``sign(d) * max(|d| - threshold, 0)`` element-wise; ``threshold`` >= 0 broadcasts."""
    return d - torch.clamp(d, -threshold, threshold)


def shrink_to_reference(
    mean: torch.Tensor,
    var: torch.Tensor,
    ref_mean: torch.Tensor,
    ref_var: torch.Tensor,
    length: int,
    k: float | torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NOTE's instance-aware rule (IABN, Gong et al., NeurIPS 2022, Sec. 3.1; the released
    ``utils/iabn.py``): keep each instance statistic only where it leaves the reference by more
    than ``k`` standard errors, soft-shrunk by that margin.

    ``mean' = ref_mean + softshrink(mean - ref_mean, k * sqrt((ref_var + eps) / L))`` and
    ``var' = relu(ref_var + softshrink(var - ref_var, k * (ref_var + eps) * sqrt(2 / (L - 1))))``.

    Args:
        mean, var: (B, C) instance mean and unbiased variance over ``length = H*W`` > 1 positions.
        ref_mean, ref_var: (C,) or (B, C) reference statistics.
        k: shrink width in standard errors (>= 0; a float, a 0-d or a (C,) tensor).
        eps: the BN layer's epsilon.

    Returns:
        ``(mean', var')``, each (B, C).
    """
    se_var = (ref_var + eps) * math.sqrt(2.0 / (length - 1))
    mean = shrink_mean(mean, ref_mean, ref_var, length, k, eps)
    var = torch.relu(ref_var + soft_shrink(var - ref_var, k * se_var))
    return mean, var


def shrink_mean(mean: torch.Tensor, ref_mean: torch.Tensor, ref_var: torch.Tensor, length: int,
                k: float | torch.Tensor, eps: float) -> torch.Tensor:
    """The mean of :func:`shrink_to_reference`:
    ``ref_mean + softshrink(mean - ref_mean, k * sqrt((ref_var + eps) / L))``."""
    return ref_mean + soft_shrink(mean - ref_mean, k * torch.sqrt((ref_var + eps) / length))
