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

from dyntta.norm.class_balance import ClassBalance
from dyntta.norm.finch import next_level
from dyntta.norm.lisc import lisc, same_cluster
from dyntta.norm.mixing import shift_weight, size_weight
from dyntta.norm.neighbours import nearest_neighbours
from dyntta.norm.stats import (
    batch_stats,
    cluster_stats,
    instance_stats,
    neighbourhood_stats,
    shrink_to_reference,
    spread_ratio,
)
from dyntta.norm.window_match import WindowMatch
from dyntta.state import CarriesState

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
            (faster on large maps, slower on small ones, where its few extra calls weigh:
            RESULTS.md, "Forward latency"). Its rounding differs from the broadcast's by about
            an ulp, so layers whose outputs are pinned (DYN's) keep the default.
    """
    tracked = (x, mean, var, weight, bias)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tracked)
    if mean.ndim == 1 and not grad:
        return F.batch_norm(x, mean, var, weight, bias, False, 0.0, eps)
    if fused and not grad:
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


class SourceNorm2d(nn.Module):
    """Base class: a BN layer's source parameters plus a rule for the test statistics.

    Subclasses implement :meth:`statistics`. Buffers ``running_mean``/``running_var`` and
    parameters ``weight``/``bias`` are copies of the source layer's. ``fused``: see
    :func:`normalize`.
    """

    fused = False

    def __init__(self, bn: nn.BatchNorm2d) -> None:
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
        if bn.affine:
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


SourceWeight = Literal["fixed", "size", "shift", "set"]


class ClusterAwareBatchNorm2d(CarriesState, SourceNorm2d):
    """CABN, DYN's layer: cluster the batch by instance means, normalise each cluster with
    source statistics mixed with the cluster's own.

    Per sample i: instance mean ``mu_i`` and variance ``s2_i`` over H x W. Per cluster k (LISC on
    the ``mu_i``): ``mu_k``, ``s2_k`` (see :func:`~dyntta.norm.stats.cluster_stats`). Then
    ``mean = a * mu_src + (1 - a) * mu_k`` and, with ``mix="var"`` (default, as the authors'
    released code computes it), ``var = a * var_src + (1 - a) * s2_k``; with ``mix="std"`` (the
    paper's equation) the standard deviations are mixed, ``sqrt(var) = a * sd_src + (1 - a) * sd_k``.

    Its window (the remembered instance statistics) and the signature and match filters it
    feeds and reads are adaptation state, carried by its state dict (:mod:`dyntta.state`).

    Args:
        bn: the source BatchNorm2d.
        alpha: weight of the source statistics, 0.8 in the paper and code.
        mix: ``"var"``, ``"std"`` or ``"log"`` (beyond the paper): the geometric
            mean ``(var_src + eps) ** a * (s2_k + eps) ** (1 - a) - eps``, i.e. the mix in
            log-variance, where a variance is a scale and a shift by a factor and by its
            inverse weigh alike; an arithmetic mix is dominated by the larger variance (a
            low-contrast cluster at 1/20 of the source's variance, mixed with a = 0.67, is
            normalised by 13.7x its own variance, by 7.4x geometrically).
        unbiased: instance variance over H*W - 1 (the code's ``torch.var_mean`` default).
        clustering: maps (B, C) instance means to (B,) labels; ``None`` (default) is LISC
            without its 0..K-1 relabelling, which the statistics do not need.

    Options beyond the paper, each off by default, so that the defaults are DYN:

    Args:
        merge_levels: FINCH partition levels applied after LISC (:func:`~dyntta.norm.finch.
            next_level`), 0 (DYN). Motivation: LISC makes ~14 clusters of 4-5 samples in a
            64-image batch of one domain.
        source_weight: the weight ``a`` of the source statistics, per cluster: ``"fixed"``
            (``alpha``, DYN), ``"size"`` (Schneider et al.'s ``N / (N + n_k)``, N =
            ``prior_strength``) or ``"shift"`` (James-Stein shrinkage towards the source, see
            :mod:`dyntta.norm.mixing`), or ``"set"``: one weight for the whole batch, the 0-dim
            buffer ``set_weight`` (``alpha`` until the caller fills it, e.g. a method that sets
            it from its predictions before each batch; a buffer, so compiled code reads its
            current value).
        prior_strength: N of ``source_weight="size"``, in samples; 16.
        instance_k: ``None`` (DYN) or k >= 0: NOTE's instance-aware rule around the mixed cluster
            statistics (:func:`~dyntta.norm.stats.shrink_to_reference`, the cluster in place
            of IABN's batch); 1x1 maps keep the cluster statistics.
        instance_spread: ``None`` (DYN) or c >= 0, with ``instance_k``: widen the instance rule's
            band, per layer (or channel: ``spread_per``) and batch, to
            ``max(instance_k, c * sqrt(rho))`` standard errors, where ``rho``
            (:func:`~dyntta.norm.stats.spread_ratio`) is the spread of instance means inside
            each sample's cluster or neighbourhood in units of IABN's squared standard error.
            IABN's standard error assumes independent positions; where the positions of a map
            are correlated (natural images: rho ~ 100-500 at the first BN layer of the CIFAR
            ResNet-20), the band becomes c standard deviations of the instance means actually
            observed, so that only outliers keep their own statistics;
            where rho is small (the digits' single-domain batches: ~1-13) it stays ``instance_k``.
        spread_per: ``"layer"`` (rho the median over channels: one band per layer) or
            ``"channel"`` (each channel's own rho and band).
        instance_around: ``"mixed"``: the instance rule around the statistics mixed with the
            source; ``"cluster"``: around the cluster's own statistics, which are then mixed.
        cluster: ``False`` puts the whole batch (and window) in one cluster: mixed batch
            statistics, for layers where clustering does not separate domains.
        neighbours: n > 0 replaces the LISC partition by neighbourhoods: each sample's
            statistics are those of its n nearest samples (itself included) in the batch and
            window, by LISC's cosine similarity of instance means
            (:mod:`~dyntta.norm.neighbours`); ``source_weight="size"`` then weights the source
            ``N / (N + n)``. 0 (DYN). Motivation: LISC's first-neighbour chains over-split one
            domain, and 8 most similar samples per sample beat its clusters (RESULTS.md, "How
            dyn_adaptive's defaults were chosen"). Needs ``cluster=True``, no ``clustering``, no ``merge_levels`` and not ``"shift"``
            (James-Stein needs disjoint clusters).
        window: W > 0 keeps the instance means and variances (no feature maps) of the last W
            samples seen by the layer, clustered with the current batch and counted in its
            clusters' statistics; 0 (DYN). Stateful: :meth:`reset_window` empties it.
        top_up: with a window, use only the ``max(0, W - B)`` most recent of its samples, so
            the statistics of a batch of B samples always come from at least W samples and a
            batch of W or more uses the window not at all (its result is the windowless one).
        signature: a :class:`~dyntta.norm.window_match.WindowMatch` this layer writes its
            instance means into, every forward (a layer that separates domains).
        match: a :class:`~dyntta.norm.window_match.WindowMatch` (written by an earlier layer)
            that decides which window samples this layer keeps: those that look like the
            current pool there. Lets a long window span one domain, not the last few. Or a
            :class:`~dyntta.norm.class_balance.ClassBalance`: the most recent samples of each
            predicted class, against label shift.
        fused: normalise with per-sample statistics in one fused kernel (:func:`normalize`;
            the same values up to an ulp, faster on maps of 16 x 16 and more, slower on small
            ones).

    After each forward, ``last_labels`` holds the (B,) cluster labels of that batch (with the
    default LISC, ids in 0..B-1 that are equal exactly within a cluster; with a window, ids over
    window and batch); ``None`` with ``neighbours`` (neighbourhoods are not a partition).
    """

    def __init__(
        self,
        bn: nn.BatchNorm2d,
        alpha: float = 0.8,
        mix: Literal["var", "std", "log"] = "var",
        unbiased: bool = True,
        clustering: Clustering | None = None,
        merge_levels: int = 0,
        source_weight: SourceWeight = "fixed",
        prior_strength: float = 16.0,
        instance_k: float | None = None,
        instance_spread: float | None = None,
        spread_per: str = "layer",
        instance_around: str = "mixed",
        cluster: bool = True,
        neighbours: int = 0,
        window: int = 0,
        top_up: bool = False,
        signature: WindowMatch | None = None,
        match: WindowMatch | ClassBalance | None = None,
        fused: bool = False,
    ) -> None:
        super().__init__(bn)
        if mix not in ("var", "std", "log"):
            raise ValueError(f"mix must be 'var', 'std' or 'log', got {mix!r}")
        if merge_levels < 0:
            raise ValueError(f"merge_levels must be >= 0, got {merge_levels}")
        if source_weight not in ("fixed", "size", "shift", "set"):
            raise ValueError(
                f"source_weight must be 'fixed', 'size', 'shift' or 'set', got {source_weight!r}"
            )
        if not prior_strength > 0:
            raise ValueError(f"prior_strength must be > 0 (samples), got {prior_strength}")
        if instance_k is not None and not instance_k >= 0:
            raise ValueError(f"instance_k must be None or >= 0, got {instance_k}")
        if instance_spread is not None and (instance_k is None or not instance_spread >= 0):
            raise ValueError("instance_spread must be None or >= 0, and needs instance_k "
                             f"(got instance_spread={instance_spread}, instance_k={instance_k})")
        if spread_per not in ("layer", "channel"):
            raise ValueError(f"spread_per must be 'layer' or 'channel', got {spread_per!r}")
        if instance_around not in ("mixed", "cluster"):
            raise ValueError(
                f"instance_around must be 'mixed' or 'cluster', got {instance_around!r}")
        if window < 0:
            raise ValueError(f"window must be >= 0 (samples), got {window}")
        if neighbours < 0:
            raise ValueError(f"neighbours must be >= 0 (samples), got {neighbours}")
        if neighbours and (not cluster or clustering is not None or merge_levels
                           or source_weight == "shift"):
            raise ValueError("neighbours > 0 replaces the LISC partition: it needs cluster=True, "
                             "no clustering, merge_levels=0 and source_weight 'fixed' or 'size' "
                             "(set neighbours=0 for the others)")
        self.alpha = alpha
        self.mix_rule = mix
        self.unbiased = unbiased
        self.clustering = clustering
        self.merge_levels = merge_levels
        self.source_weight = source_weight
        self.prior_strength = prior_strength
        self.instance_k = instance_k
        self.instance_spread = instance_spread
        self.spread_per = spread_per
        self.instance_around = instance_around
        self.cluster = cluster
        self.neighbours = neighbours
        self.window = window
        self.top_up = top_up
        self.signature = signature
        self.match = match
        self.fused = fused
        self.last_labels: torch.Tensor | None = None
        if source_weight == "set":
            self.register_buffer("set_weight", torch.tensor(float(alpha)))
        self.reset_window()

    adaptation_state = ("window_mean", "window_var", "signature", "match")

    def reset_window(self) -> None:
        """Forget the window's instance statistics (no-op without a window)."""
        self.window_mean: torch.Tensor | None = None
        self.window_var: torch.Tensor | None = None
        if self.signature is not None:
            self.signature.reset()

    def labels(self, mu: torch.Tensor) -> torch.Tensor:
        """(N,) cluster labels of detached instance means ``mu: (N, C)``."""
        if not self.cluster:
            return torch.zeros(mu.shape[0], dtype=torch.long, device=mu.device)
        if self.clustering is None:
            labels = lisc(mu, canonical=False)
        else:
            labels = self.clustering(mu)
        for _ in range(self.merge_levels):
            labels = next_level(mu, labels)
        return labels

    def weight_of_source(
        self, mu: torch.Tensor, cluster_mean: torch.Tensor, sizes: torch.Tensor | int
    ) -> float | torch.Tensor:
        """``alpha`` (fixed) or the per-sample source weight of its cluster, for (N, 1) cluster
        sizes (or one size for all, as a neighbourhood's)."""
        if self.source_weight == "fixed":
            return self.alpha
        if self.source_weight == "set":
            return self.set_weight
        if self.source_weight == "size":
            return size_weight(sizes, self.prior_strength)
        return shift_weight(mu, cluster_mean, sizes, self.running_mean, self.alpha)

    def statistics(self, x):
        mu, s2 = instance_stats(x, unbiased=self.unbiased)
        if self.signature is not None:
            self.signature.observe(mu)
        b = x.shape[0]
        kept_rows = None  # (N,) bool: the rows that enter the statistics (None: all)
        extra = max(0, self.window - b) if self.top_up else self.window
        # the remembered rows and the batch: a suffix of everything seen, at least the last
        # `window` rows of it, so the window to remember is its tail
        pool_mu, pool_s2 = mu, s2
        if extra and self.window_mean is not None:
            pool_mu = torch.cat([self.window_mean[-extra:], mu])
            pool_s2 = torch.cat([self.window_var[-extra:], s2])
        all_mu, all_s2 = pool_mu, pool_s2
        if self.match is not None and pool_mu.shape[0] > b:
            kept = self.match.keep(pool_mu.shape[0] - b, b)
            rows = torch.cat([kept, kept.new_ones(b)])
            if self.cluster:
                all_mu, all_s2 = pool_mu[rows], pool_s2[rows]
            else:  # the dropped rows become singletons: no data-dependent shape to compile
                kept_rows = rows
        widen = self.instance_spread is not None
        spread = None  # with instance_spread: the variance of instance means in each group
        if self.neighbours:
            index = nearest_neighbours(all_mu.detach(), self.neighbours, b)
            cluster_mean, cluster_var, spread = neighbourhood_stats(all_mu, all_s2, index)
            a = self.weight_of_source(mu.detach(), cluster_mean.detach(), index.shape[1])
            spread = spread.detach() if widen else None
        elif not self.cluster and self.source_weight != "shift":
            # one cluster of the kept rows: weighted means, O(N) instead of the (N, N) product;
            # (C,) statistics shared by the batch, which normalize() applies in one fused kernel
            weight = all_mu.new_ones(all_mu.shape[0]) if kept_rows is None else \
                kept_rows.to(all_mu.dtype)
            size = weight.sum()
            cluster_mean = weight @ all_mu / size
            deviation = (all_mu - cluster_mean).square()
            cluster_var = weight @ (all_s2 + deviation) / size
            self.last_labels = torch.zeros(b, dtype=torch.long, device=mu.device)
            a = self.weight_of_source(mu.detach(), cluster_mean.detach(), size)
            if widen:
                spread = (weight @ deviation.detach() / size).expand(b, -1)
        else:
            labels = self.labels(all_mu.detach())
            if kept_rows is not None:
                singles = torch.arange(1, labels.shape[0] + 1, device=labels.device)
                labels = torch.where(kept_rows, labels, singles)
            self.last_labels = labels[-b:]
            cluster_mean, cluster_var = cluster_stats(all_mu, all_s2, labels)
            sizes = same_cluster(labels).sum(1, keepdim=True).to(mu.dtype)
            a = self.weight_of_source(all_mu.detach(), cluster_mean.detach(), sizes)
            cluster_mean, cluster_var = cluster_mean[-b:], cluster_var[-b:]
            if isinstance(a, torch.Tensor) and a.ndim:
                a = a[-b:]
            if widen:
                spread = cluster_stats(all_mu.detach(), torch.zeros_like(all_s2), labels)[1][-b:]
        if self.window:
            self.window_mean = pool_mu.detach()[-self.window :]
            self.window_var = pool_s2.detach()[-self.window :]
        length = x.shape[2] * x.shape[3]
        instance = self.instance_k is not None and length > 1
        if instance:
            if not self.unbiased:  # the rule's standard errors assume the unbiased variance
                s2 = s2 * (length / (length - 1))
            k = self.instance_k
            if widen:
                rho = spread_ratio(spread, s2.detach(), length, self.eps,
                                   self.spread_per == "channel")
                k = torch.clamp(self.instance_spread * rho.sqrt(), min=k)
            if self.instance_around == "cluster":
                cluster_mean, cluster_var = shrink_to_reference(
                    mu, s2, cluster_mean, cluster_var, length, k, self.eps)
        mean = mix(self.running_mean, cluster_mean, a)
        if self.mix_rule == "var":
            var = mix(self.running_var, cluster_var, a)
        elif self.mix_rule == "log":
            var = torch.exp(mix((self.running_var + self.eps).log(), (cluster_var + self.eps).log(),
                                a)).sub(self.eps).clamp_min(0.0)
        else:
            var = mix(self.running_var.sqrt(), cluster_var.sqrt(), a).square()
        if instance and self.instance_around == "mixed":
            mean, var = shrink_to_reference(mu, s2, mean, var, length, k, self.eps)
        return mean, var

    def extra_repr(self) -> str:
        extra = f"{super().extra_repr()}, alpha={self.alpha}, mix={self.mix_rule!r}"
        options = {
            "merge_levels": (self.merge_levels, 0),
            "source_weight": (self.source_weight, "fixed"),
            "instance_k": (self.instance_k, None),
            "instance_spread": (self.instance_spread, None),
            "spread_per": (self.spread_per, "layer"),
            "instance_around": (self.instance_around, "mixed"),
            "cluster": (self.cluster, True),
            "neighbours": (self.neighbours, 0),
            "window": (self.window, 0),
            "top_up": (self.top_up, False),
            "signature": (self.signature is not None, False),
            "match": (self.match is not None, False),
            "fused": (self.fused, False),
        }
        changed = [f"{k}={v!r}" for k, (v, default) in options.items() if v != default]
        if self.source_weight == "size":
            changed.append(f"prior_strength={self.prior_strength}")
        return ", ".join([extra, *changed])
