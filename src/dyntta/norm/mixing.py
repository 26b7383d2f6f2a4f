"""Source weights that adapt to the data (beyond the DYN paper).

DYN mixes every cluster's statistics with the source's at a fixed source weight 0.8, whatever
the cluster's size and whatever the classes in the batch. Here the weight follows the number of
samples behind a statistic, or how far the recent predictions' classes depart from those of a
longer stretch (label shift).
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


def label_balance_weight(
    classes: torch.Tensor, reference: torch.Tensor, num_classes: int, balanced: float,
    power: float,
) -> float:
    """Source weight from how far the recent predicted classes depart from those of a longer
    stretch: ``1 - (1 - balanced) * e ** power`` with ``e = (K r - 1) / (K - 1)`` clipped to
    [0, 1] and ``r = 1 / sum_c p_c^2 / q_c = 1 / (1 + chi^2(p || q))``, p and q the shares of
    each class among ``classes`` and among ``reference``, over K classes. Where q is uniform,
    ``K r`` is the inverse Simpson index of p (Hill's diversity of order 2, Ecology 1973: the
    effective number of classes) and e its evenness, ``(D - 1) / (K - 1)``.

    Statistics that follow the labels (deep BN layers) follow label shift too; the source's were
    computed on balanced classes. Recent predictions spread over the classes as the longer
    stretch's (``e = 1``) give the source the weight ``balanced``, whichever classes the model
    favours under the current shift; those concentrated on classes the longer stretch seldom
    predicts (label shift) give it up to all the weight.

    Args:
        classes: (n,) recent predicted classes in ``0..num_classes-1`` (n >= 1).
        reference: (m,) the predicted classes of a longer stretch that ends with ``classes``
            (each class of ``classes`` is among them).
        num_classes: K >= 2.
        balanced: the source weight when the classes are spread as the reference's, in [0, 1].
        power: p >= 0; larger p lowers the weight of the source only for near-even classes.
    """
    p = torch.bincount(classes, minlength=num_classes).double() / classes.shape[0]
    q = torch.bincount(reference, minlength=num_classes).double() / reference.shape[0]
    if bool(((p > 0) & (q == 0)).any()):
        raise ValueError("label_balance_weight: a recent class is missing from the reference")
    seen = p > 0
    r = 1.0 / (p[seen].square() / q[seen]).sum()
    evenness = (num_classes * r - 1.0) / (num_classes - 1)
    return 1.0 - (1.0 - balanced) * float(evenness.clamp(0.0, 1.0)) ** power
