"""Backward-free normalisation layers that replace ``nn.BatchNorm2d``.

Every layer keeps the source BN's running statistics (buffers) and affine parameters (``gamma``,
``beta``) and only changes which statistics normalise the input. None of them updates the source
statistics: the same batch always gives the same output.
"""

from __future__ import annotations

from typing import Callable, Literal

import torch
from torch import nn
from torch.nn import functional as F

from dyntta.norm.lisc import lisc
from dyntta.norm.stats import batch_stats, cluster_stats, instance_stats

Clustering = Callable[[torch.Tensor], torch.Tensor]
"""Maps instance means (B, C) to (B,) integer cluster labels; equal labels share a cluster."""


def normalize(
    x: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    fused: bool = False,
) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias``, differentiable in every argument.

    Shared (C,) statistics without autograd run PyTorch's fused inference BN kernel; otherwise
    the (B, C) scale and shift are folded first and applied in one broadcast multiply-add.

    Args:
        x: (B, C, H, W).
        mean, var: (C,) shared by the batch or (B, C) per sample.
        weight, bias: (C,) or None (no affine).
        fused: per-sample statistics without autograd also run the fused kernel, on the batch
            folded into the channels, (1, B * C, H, W): one pass over ``x`` instead of two
            (``benchmarks/norm_layer_overhead.py``, CPU, one thread, three runs on each of two
            days: 0.26-0.89x the time on 32 x 32 maps, 0.88-0.89x on 16 x 16, 0.98-1.12x on
            8 x 8 at B = 64, 1.5-1.7x on 8 x 8 at B = 16, where the fold's few extra calls
            weigh). Its rounding differs from the broadcast's by about an ulp, so layers whose
            outputs are pinned (DYN's) keep the default. Eager only: in a graph being compiled
            inductor fuses the broadcast itself, and the fold would only add nodes.
    """
    tracked = (x, mean, var, weight, bias)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tracked)
    if mean.ndim == 1 and not grad:
        return F.batch_norm(x, mean, var, weight, bias, False, 0.0, eps)
    if fused and not grad and not torch.compiler.is_compiling():
        b, c = x.shape[:2]
        weight, bias = (None if t is None else t.expand(b, -1).reshape(-1) for t in (weight, bias))
        folded = F.batch_norm(x.reshape(1, b * c, *x.shape[2:]), mean.reshape(-1),
                              var.reshape(-1), weight, bias, False, 0.0, eps)
        return folded.reshape(x.shape)
    scale = torch.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    shift = -mean * scale if bias is None else torch.addcmul(bias, mean, scale, value=-1.0)
    shape = (-1, x.shape[1], 1, 1)
    return (x * scale.reshape(shape)).add_(shift.reshape(shape))


def mix(
    source: torch.Tensor, target: torch.Tensor, alpha: float | torch.Tensor
) -> torch.Tensor:
    """``alpha * source + (1 - alpha) * target``; ``alpha`` is the weight of the source, a float
    or a tensor broadcasting against ``target`` (e.g. (B, 1) per sample).

    ``torch.lerp`` is exact at both ends: ``alpha = 1`` returns ``source`` bit for bit.
    """
    return torch.lerp(target, source, alpha)


def compiled_here(*tensors: torch.Tensor) -> bool:
    """Whether a graph is being compiled that takes no gradient through ``tensors`` (then a
    layer may call its registered operator, which has no autograd)."""
    return torch.compiler.is_compiling() and not (
        torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


class SourceNorm2d(nn.Module):
    """Base class: a BN layer's source parameters plus a rule for the test statistics.

    Subclasses implement :meth:`statistics`. Buffers ``running_mean``/``running_var`` and
    parameters ``weight``/``bias`` are copies of the source layer's. ``fused``: see
    :func:`normalize`.
    """

    fused = False

    def __init__(self, bn: nn.BatchNorm2d | SourceNorm2d) -> None:
        super().__init__()
        self.num_features = bn.num_features
        self.eps = bn.eps
        if bn.running_mean is None or bn.running_var is None:
            raise ValueError(
                f"{type(self).__name__} needs the source running statistics, but the "
                "BatchNorm2d was built with track_running_stats=False"
            )
        self.register_buffer("running_mean", bn.running_mean.detach().clone())
        self.register_buffer("running_var", bn.running_var.detach().clone())
        if bn.weight is not None:  # an affine BatchNorm2d, or another SourceNorm2d
            self.weight = nn.Parameter(bn.weight.detach().clone())
            self.bias = nn.Parameter(bn.bias.detach().clone())
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(mean, var)`` for ``x: (B, C, H, W)``, each (C,) or (B, C)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__} expects (B, {self.num_features}, H, W), "
                f"got {tuple(x.shape)}"
            )
        mean, var = self.statistics(x)
        return normalize(x, mean, var, self.weight, self.bias, self.eps, self.fused)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"


class SourceBatchNorm2d(SourceNorm2d):
    """The source model's eval-mode BN: normalise with the running statistics."""

    def statistics(self, x):
        return self.running_mean, self.running_var


class TestBatchNorm2d(SourceNorm2d):
    """TBN: normalise with the current batch's statistics (Nado et al., 2020; Schneider et al.,
    NeurIPS 2020), i.e. BN in training mode without updating the running statistics."""

    __test__ = False  # not a pytest test class, despite its name

    def statistics(self, x):
        return batch_stats(x)


class AlphaBatchNorm2d(SourceNorm2d):
    """alpha-BN: ``alpha * source + (1 - alpha) * batch`` for both mean and variance.

    ``alpha`` is the weight of the source statistics, the same convention as DYN's ``alpha``.
    """

    def __init__(self, bn: nn.BatchNorm2d, alpha: float) -> None:
        super().__init__(bn)
        self.alpha = alpha

    def statistics(self, x):
        mean, var = batch_stats(x)
        return mix(self.running_mean, mean, self.alpha), mix(self.running_var, var, self.alpha)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha}"


def cabn_mix(
    mu: torch.Tensor,
    s2: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    alpha: float,
    mix_std: bool,
    clustering: Clustering | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CABN's ``(mean, var, labels)`` from the (B, C) instance means ``mu`` and variances
    ``s2``: the statistics of each sample's cluster (LISC's ids unless ``clustering``) mixed with
    the source's at weight ``alpha``, variances (``mix_std=False``) or standard deviations."""
    detached = mu.detach()
    labels = lisc(detached, canonical=False) if clustering is None else clustering(detached)
    cluster_mean, cluster_var = cluster_stats(mu, s2, labels)
    mean = mix(running_mean, cluster_mean, alpha)
    if not mix_std:
        return mean, mix(running_var, cluster_var, alpha), labels
    return mean, mix(running_var.sqrt(), cluster_var.sqrt(), alpha).square(), labels


def _cabn_mix_op(mu: torch.Tensor, s2: torch.Tensor, running_mean: torch.Tensor,
                 running_var: torch.Tensor, alpha: float, mix_std: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return cabn_mix(mu, s2, running_mean, running_var, alpha, mix_std)


traced_cabn_mix = torch.library.custom_op("dyntta::cabn_mix", mutates_args=())(_cabn_mix_op)
""":func:`cabn_mix` with LISC as one operator in a ``torch.compile`` graph: inductor compiles
the instance statistics and the normalisation around it (fused with the network), not the
clustering, the cluster statistics or their mix (no autograd: DYN takes no gradient)."""


@traced_cabn_mix.register_fake
def _(mu, s2, running_mean, running_var, alpha, mix_std):
    return torch.empty_like(mu), torch.empty_like(mu), mu.new_empty(mu.shape[0], dtype=torch.long)


class ClusterAwareBatchNorm2d(SourceNorm2d):
    """CABN, DYN's layer: cluster the batch by instance means, normalise each cluster with
    source statistics mixed with the cluster's own.

    Per sample i: instance mean ``mu_i`` and variance ``s2_i`` over H x W. Per cluster k (LISC on
    the ``mu_i``): ``mu_k``, ``s2_k`` (see :func:`~dyntta.norm.stats.cluster_stats`). Then
    ``mean = a * mu_src + (1 - a) * mu_k`` and, with ``mix="var"`` (default, as the authors'
    released code computes it), ``var = a * var_src + (1 - a) * s2_k``; with ``mix="std"`` (the
    paper's equation) the standard deviations are mixed, ``sqrt(var) = a * sd_src + (1 - a) * sd_k``.

    Args:
        bn: the source BatchNorm2d.
        alpha: weight of the source statistics, 0.8 in the paper and code.
        mix: ``"var"`` or ``"std"``.
        unbiased: instance variance over H*W - 1 (the code's ``torch.var_mean`` default).
        clustering: maps (B, C) instance means to (B,) labels; ``None`` (default) is LISC
            without its 0..K-1 relabelling, which the statistics do not need.

    After each forward, ``last_labels`` holds the (B,) cluster labels of that batch (with LISC,
    ids in 0..B-1 that are equal exactly within a cluster).
    """

    def __init__(
        self,
        bn: nn.BatchNorm2d,
        alpha: float = 0.8,
        mix: Literal["var", "std"] = "var",
        unbiased: bool = True,
        clustering: Clustering | None = None,
    ) -> None:
        super().__init__(bn)
        if mix not in ("var", "std"):
            raise ValueError(f"mix must be 'var' or 'std', got {mix!r}")
        self.alpha = alpha
        self.mix_rule = mix
        self.unbiased = unbiased
        self.clustering = clustering
        self.last_labels: torch.Tensor | None = None

    def statistics(self, x):
        mu, s2 = instance_stats(x, unbiased=self.unbiased)
        mix_std = self.mix_rule == "std"
        if self.clustering is None and compiled_here(x):
            mean, var, self.last_labels = traced_cabn_mix(
                mu, s2, self.running_mean, self.running_var, self.alpha, mix_std)
        else:
            mean, var, self.last_labels = cabn_mix(mu, s2, self.running_mean, self.running_var,
                                                   self.alpha, mix_std, self.clustering)
        return mean, var

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha}, mix={self.mix_rule!r}"
