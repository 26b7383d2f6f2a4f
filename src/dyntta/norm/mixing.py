"""Source weights that adapt to the data (beyond the DYN paper).

DYN mixes every cluster's statistics with the source's at a fixed source weight 0.8, whatever
the cluster's size and whatever the classes in the batch. Here the weight follows the number of
samples behind a statistic, or how evenly the recent predictions spread over the classes.
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


def bounded_mix(
    source: torch.Tensor, target: torch.Tensor, weight: float | torch.Tensor,
    bound: torch.Tensor,
) -> torch.Tensor:
    """``target`` pulled towards ``source`` by ``weight`` times their difference, clipped at
    ``bound``: ``target - weight * clamp(target - source, -bound, bound)``. A prior whose pull
    never exceeds ``weight`` times ``bound`` (e.g. the spread of the samples behind ``target``):
    a statistic far from the source's moves by at most that, one near it as by
    ``mix(source, target, weight)`` (Huber's clipping of an influence, Ann. Math. Statist. 1964).

    Args:
        source, target, bound: broadcasting tensors, ``bound`` >= 0.
        weight: the source's weight in [0, 1].
    """
    return target - weight * torch.clamp(target - source, -bound, bound)


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
