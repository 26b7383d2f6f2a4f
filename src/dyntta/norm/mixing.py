"""Source weights for cluster-aware BN that adapt to the data (beyond the DYN paper).

DYN mixes every cluster's statistics with the source's at a fixed source weight 0.8, whatever
the cluster's size, however far its statistics lie from the source's and whatever the classes in
the batch. The size and shift weights here are per sample (the weight of its cluster), shape
(N, 1), to broadcast over channels; the label-balance weight is one number per batch.
"""

from __future__ import annotations

import torch


def size_weight(sizes: torch.Tensor, strength: float) -> torch.Tensor:
    """Schneider et al.'s prior (NeurIPS 2020, "Improving robustness against common corruptions
    by covariate shift adaptation", Eq. 3): the source statistics count as ``strength`` = N
    pseudo-samples against the cluster's n samples, source weight ``N / (N + n)``.

    Args:
        sizes: (N, 1) size of each sample's cluster, or one size for all (a number).
        strength: N > 0, the prior's weight in samples (their hyper-parameter).
    """
    return strength / (strength + sizes)


def shift_weight(
    mu: torch.Tensor,
    cluster_mean: torch.Tensor,
    sizes: torch.Tensor,
    source_mean: torch.Tensor,
    fallback: float,
) -> torch.Tensor:
    """Positive-part James-Stein shrinkage of each cluster mean towards the source mean
    (Efron & Morris, JASA 1973): source weight ``min(1, sum_c se2_c / sum_c d_c^2)``.

    ``d = mu_k - mu_src`` is the cluster's shift from the source and ``se2_c = v_c / n_k`` the
    sampling variance of its mean, with ``v_c`` the within-cluster variance of the instance means
    pooled over the batch (divisor N - K, K clusters). A cluster far from the source (shift large
    against its noise) keeps its own statistics; one indistinguishable from the source, or too
    small to tell, takes the source's. Constant-free, like DATTA's mixedness score (Ye et al.,
    ICME 2025) in spirit, but per cluster and without a threshold. Where no sample shares a
    cluster (N == K, e.g. one sample) the variance is unknown and ``fallback`` is used.

    Args:
        mu: (N, C) instance means; cluster_mean: (N, C) each sample's cluster mean.
        sizes: (N, 1) cluster sizes; source_mean: (C,).
        fallback: source weight when N == K.
    """
    n = mu.shape[0]
    clusters = (1.0 / sizes).sum()
    pooled = (mu - cluster_mean).square().sum(0) / (n - clusters).clamp_min(1.0)
    noise = pooled.sum() / sizes
    shift = (cluster_mean - source_mean).square().sum(1, keepdim=True)
    weight = (noise / shift.clamp_min(torch.finfo(mu.dtype).tiny)).clamp_max(1.0)
    return torch.where(n - clusters > 0.5, weight, torch.full_like(weight, fallback))


def label_balance_weight(
    classes: torch.Tensor, num_classes: int, balanced: float, power: float
) -> float:
    """Source weight from how evenly recent predictions spread over the classes: ``1 - (1 -
    balanced) * e ** power``, with ``e = (D - 1) / (K - 1)`` in [0, 1] the evenness of the
    predicted classes, ``D = 1 / sum_c p_c^2`` their inverse Simpson index (Hill's diversity of
    order 2, Ecology 1973: the effective number of classes) over K classes.

    Statistics that follow the labels (deep BN layers) follow label shift too; the source's were
    computed on balanced classes. Predictions spread over every class (``e = 1``) give the source
    the weight ``balanced``; predictions of one class (``e = 0``) give it all the weight.

    Args:
        classes: (n,) recent predicted classes in ``0..num_classes-1`` (n >= 1).
        num_classes: K >= 2.
        balanced: the source weight when the classes are perfectly even, in [0, 1].
        power: p >= 0; larger p lowers the weight of the source only for near-even classes.
    """
    p = torch.bincount(classes, minlength=num_classes).double() / classes.shape[0]
    evenness = (1.0 / p.square().sum() - 1.0) / (num_classes - 1)
    return 1.0 - (1.0 - balanced) * float(evenness.clamp(0.0, 1.0)) ** power
