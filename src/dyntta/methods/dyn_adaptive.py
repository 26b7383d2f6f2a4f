"""DYN-adaptive: DYN's cluster-aware BN with rules that adapt to the batch (beyond the paper).

Not the DYN paper's method (that is ``dyn``, kept bit-identical): the same LISC + CABN layer with
the options beyond the paper (:class:`~dyntta.norm.ClusterAwareBatchNorm2d`), composed as chosen
by the ablation in RESULTS.md ("How dyn_adaptive's defaults were chosen"):

- in the first half of the BN layers each sample takes the statistics of its 8 nearest samples
  (LISC's cosine similarity of instance means; a neighbourhood instead of DYN's LISC cluster)
  and weights the source by that size, ``16 / (16 + 8)`` (Schneider et al.'s prior, NeurIPS
  2020), instead of DYN's fixed 0.8;
- the other half use the whole batch as one cluster, with a source weight that follows how
  evenly the model's last 64 predictions spread over the classes: 0.4 where they are even,
  rising as the square of their unevenness to 1 where they are all one class (DYN's fixed 0.8
  before the first prediction);
- the first quarter of the layers then apply NOTE's instance-aware rule around those
  statistics, at k = 8 standard errors, widened per channel and batch to 2.5 standard deviations
  of the instance means actually observed within the samples' groups where those vary more than
  IABN's standard error assumes (``instance_spread``, ``spread_per``: correlated positions in
  natural images); the other layers keep their group's statistics (``instance_fraction``);
- every layer keeps the instance means and variances (no feature maps) of its last samples and
  tops a batch of B samples up with the most recent of them: to 256 samples in the clustering
  layers, among which each sample finds its 8 nearest, to 512 in the others, which keep of them
  only those that look like the current pool at the last clustering layer (``deep_match``) and,
  of those, the 32 most recent of each class the model predicted (``deep_balance``, NOTE's
  class-balanced memory). The top-up keeps the number of samples behind every statistic at or
  above the DYN paper's batch size (64), where a cluster mean is reliable, whatever the batch
  size; the balance gives the deep layers, whose statistics follow the labels, every class
  seen lately in about equal parts under label shift.

Measured motivation: LISC over-splits one-domain batches (about 14 clusters of 4-5 samples in 64
images), its partition of a mixed batch is 6-7 points short of the true domains', and a fixed
weight ignores cluster size (8-sample neighbourhoods beat LISC's clusters in every cell measured);
clustering deep layers, where LISC groups by class rather than domain, did not help; instance-aware
statistics win on the digits; at batch 4 and 16, the window is what lifts single-domain and
label-shifted streams (deep statistics of a few label-correlated samples follow their labels; past
batches dilute that); IABN's standard errors assume independent positions, so at k = 8 the rule
fired on natural images' content (CIFAR single-domain batches -2.6) while the digits needed it, and
the observed spread tells the two apart; under label shift a class-balanced deep window is what
closes most of the gap to NOTE; a fixed deep source weight trades single-domain batches (which want
less of the source) against label shift (which wants more), and the evenness of the recent
predictions tells the two apart; one band per layer, from the median channel, left the channels
whose instance means vary more than the median's firing on content (CIFAR), and a single-domain
batch of a few samples amid other domains (Random, Wild) found only 60 recent samples to take
neighbours from; the rule's gain on the digits (their low-contrast and frost domains) lives in the
first BN layers and its cost on CIFAR in the later ones, as IBN-Net (Pan et al., ECCV 2018) found
instance statistics to carry appearance in shallow layers and content in deep ones (measurements:
RESULTS.md, "How dyn_adaptive's defaults were chosen").
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import nn

from dyntta.methods.base import check_unit_interval
from dyntta.methods.normalization import NormalizationMethod
from dyntta.methods.registry import register
from dyntta.norm import ClassBalance, ClusterAwareBatchNorm2d, WindowMatch
from dyntta.norm.mixing import label_balance_weight


@dataclasses.dataclass(frozen=True)
class DYNAdaptiveConfig:
    """Hyper-parameters of DYN-adaptive (defaults: the ablation's choice; each field's
    sensitivity is in RESULTS.md, "How dyn_adaptive's defaults were chosen").

    alpha, mix, unbiased: as DYN (``alpha`` is used only with a ``"fixed"`` source weight, as
        the shift rule's fallback and as the ``"labels"`` rule's weight before any prediction);
        ``mix`` may also be ``"log"``, the geometric mean of the variances
        (:class:`~dyntta.norm.ClusterAwareBatchNorm2d`; measured, not the default).
    merge_levels: FINCH levels after LISC (with ``neighbours=0``).
    neighbours: n > 0: the clustering layers use each sample's n nearest samples instead of its
        LISC cluster (:class:`~dyntta.norm.ClusterAwareBatchNorm2d`); 0: LISC clusters.
    source_weight: ``"fixed"``, ``"size"`` (N / (N + n_k)) or ``"shift"`` (James-Stein).
    prior_strength: N of the size rule, in samples.
    instance_k: NOTE's instance-aware rule around the cluster statistics, at least k = 8
        standard errors (None: off). Alone, a width is a compromise between the two models
        beside the project: k = 8 lifts the digits, but costs CIFAR single-domain batches about
        2.6 points (its standard errors assume independent positions, so on natural images it
        fires on content, not only on shift); ``instance_spread`` resolves it.
    instance_spread: None (off) or c >= 0: widen the instance rule's band to ``max(instance_k,
        c * sqrt(rho))`` standard errors per layer (or channel) and batch, rho the spread of
        instance means inside each sample's neighbourhood or cluster in units of the squared
        standard error (:class:`~dyntta.norm.ClusterAwareBatchNorm2d`); 2.5. Unused with
        ``instance_k=None``.
    spread_per: ``"layer"`` or ``"channel"`` (the default): ``instance_spread``'s rho per layer
        (the median over channels) or per channel (:class:`~dyntta.norm.ClusterAwareBatchNorm2d`).
    instance_around: ``"mixed"`` or ``"cluster"``: the instance rule around the statistics
        mixed with the source, or around the group's own before the mix.
    instance_fraction: the first ``round(f * L)`` of the L BN layers (network order) apply the
        instance-aware rule, the others not; 0.25. Instance statistics carry an image's
        appearance (contrast, colour, corruption) in the shallow layers and its content in the
        deep ones (IBN-Net, Pan et al., ECCV 2018, instance-normalise only shallow layers for
        that reason). Measured on the ResNet-20s (19 BN layers): the rule in the first 3 layers
        alone keeps 3.9 of the digits' 4.2 points (Wild, B = 64, seed 0: their low-contrast
        domain 25 -> 66%), in layers 2-10 it costs CIFAR 1.3; at 0.25 CIFAR gains 0.5-1.2 in
        every cell measured and the digits do not move; 0.1 and 0.15 cost the digits up to 1.2
        (RESULTS.md, "How dyn_adaptive's defaults were chosen").
    cluster_fraction: the first ``round(f * L)`` of the L BN layers (network order) cluster; the
        others use one cluster (mixed batch statistics). 1.0: every layer clusters.
    deep_source_weight: the source weight rule of the layers that do not cluster: ``"same"`` as
        ``source_weight``, ``"fixed"``/``"size"``/``"shift"``, or ``"labels"``: the weight
        follows how evenly the model's last ``window`` predictions spread over the classes,
        from ``balanced_alpha`` (every class alike) to 1 (one class)
        (:func:`~dyntta.norm.mixing.label_balance_weight`; ``alpha`` before the first batch;
        the default). There the one cluster is the whole batch (and window), whose statistics
        follow the batch's labels: a weight that falls with its size let label shift through,
        and a fixed 0.8 costs single-domain batches with balanced labels (measured: Wild and
        continual; RESULTS.md, "How dyn_adaptive's defaults were chosen").
    balanced_alpha, balance_power: the ``"labels"`` rule's source weight for perfectly even
        predictions (0.4) and its power p (2: the weight leaves 1 as the square of the
        evenness).
    window: samples whose instance statistics each layer keeps and clusters with the batch.
    shallow_window: the window of the layers that cluster (None: ``window``); 256. Their
        neighbourhoods are the 8 nearest of up to 256 samples, so a small single-domain batch
        among batches of other domains still finds samples of its own. The predictions the
        ``"labels"`` rule reads and the pool ``deep_match`` keeps stay ``window``.
    deep_window: the window of the layers that do not cluster (None: ``window``); 512.
        A longer one averages their statistics over more samples, and so over more classes,
        against label shift, while the shallow layers keep following domain changes (256
        measured at 200 rows per domain: Wild +1.8 to +4.5, single-domain streams -0.5 to
        -1.2; RESULTS.md, "How dyn_adaptive's defaults were chosen").
    deep_match: None or a quantile q in [0, 1] (0.1): the layers that do not cluster keep
        only the window samples that look like the current pool (the batch topped up to
        ``window``) at the last clustering layer: those at least as close to it (cosine of
        instance means) as the q-quantile of the pool members' nearest-neighbour similarities
        (:class:`~dyntta.norm.WindowMatch`). A long ``deep_window`` then spans the current
        domain rather than the last few (0.1 with a 256-sample deep window, 200 rows per
        domain: Wild +1.4 to +4.3, elsewhere 0.0 to -0.6; with 100-row domains single-domain
        batches -0.8 to -1.2 on CIFAR; RESULTS.md, "How dyn_adaptive's defaults were chosen").
    deep_match_reference: ``"pool"`` (the default) or ``"batch"``: what ``deep_match`` judges
        the remembered samples against, and which of them it always keeps
        (:class:`~dyntta.norm.WindowMatch`'s ``reference``). The same at ``window`` or more
        samples per batch.
    deep_balance: None or n >= 1 (32): the layers that do not cluster keep, of their
        remembered samples, only the n most recent of each class the model predicted
        (:class:`~dyntta.norm.ClassBalance`; NOTE's answer to label shift, a memory balanced over
        predicted classes). Needs a ``deep_window``; with ``deep_match``, the balance is taken
        among the samples that match the current pool.
    top_up: the window only tops a batch of B samples up to ``window`` samples (it supplies
        ``max(0, window - B)``), so batches of ``window`` or more are unchanged by it.
    fused: normalise with per-sample statistics in PyTorch's fused BN kernel (the batch folded
        into the channels; :func:`~dyntta.norm.normalize`): the same values up to an ulp, one
        pass over the features instead of two. False: DYN's two-pass broadcast.
    """

    alpha: float = 0.8
    mix: Literal["var", "std", "log"] = "var"
    unbiased: bool = True
    merge_levels: int = 0
    neighbours: int = 8
    source_weight: Literal["fixed", "size", "shift"] = "size"
    prior_strength: float = 16.0
    instance_k: float | None = 8.0
    instance_spread: float | None = 2.5
    spread_per: Literal["layer", "channel"] = "channel"
    instance_around: Literal["mixed", "cluster"] = "mixed"
    instance_fraction: float = 0.25
    cluster_fraction: float = 0.5
    deep_source_weight: Literal["same", "fixed", "size", "shift", "labels"] = "labels"
    balanced_alpha: float = 0.4
    balance_power: float = 2.0
    window: int = 64
    shallow_window: int | None = 256
    deep_window: int | None = 512
    deep_match: float | None = 0.1
    deep_match_reference: Literal["pool", "batch"] = "pool"
    deep_balance: int | None = 32
    top_up: bool = True
    fused: bool = True

    @property
    def widening(self) -> float | None:
        """``instance_spread``, or None where the instance rule is off (nothing to widen)."""
        return None if self.instance_k is None else self.instance_spread

    def __post_init__(self):
        check_unit_interval("alpha", self.alpha)
        check_unit_interval("cluster_fraction", self.cluster_fraction)
        check_unit_interval("instance_fraction", self.instance_fraction)
        if self.deep_window is not None and self.deep_window < 0:
            raise ValueError(f"deep_window must be None or >= 0 (samples), got {self.deep_window}")
        if self.shallow_window is not None and self.shallow_window < 0:
            raise ValueError("shallow_window must be None or >= 0 (samples), "
                             f"got {self.shallow_window}")
        if self.deep_match is not None:
            check_unit_interval("deep_match", self.deep_match)
        if self.deep_balance is not None:
            if self.deep_balance < 1:
                raise ValueError(f"deep_balance must be None or >= 1 (samples per class), "
                                 f"got {self.deep_balance}")
        if self.deep_match_reference not in ("pool", "batch"):
            raise ValueError("deep_match_reference must be 'pool' or 'batch', "
                             f"got {self.deep_match_reference!r}")
        if self.deep_source_weight not in ("same", "fixed", "size", "shift", "labels"):
            raise ValueError("deep_source_weight must be 'same', 'fixed', 'size', 'shift' or "
                             f"'labels', got {self.deep_source_weight!r}")
        check_unit_interval("balanced_alpha", self.balanced_alpha)
        if not self.balance_power >= 0:
            raise ValueError(f"balance_power must be >= 0, got {self.balance_power}")
        # the layer validates the others; build one to fail at construction, not at first use
        ClusterAwareBatchNorm2d(
            nn.BatchNorm2d(1), self.alpha, self.mix, self.unbiased,
            merge_levels=self.merge_levels, source_weight=self.source_weight,
            prior_strength=self.prior_strength, instance_k=self.instance_k,
            instance_spread=self.widening, spread_per=self.spread_per,
            instance_around=self.instance_around, neighbours=self.neighbours, window=self.window,
        )


@register
class DYNAdaptive(NormalizationMethod):
    """Beyond the DYN paper: DYN's cluster-aware BN with size-weighted 8-sample neighbourhoods in
    the shallow half of the layers, mixed batch statistics in the deep half (source weight from
    the evenness of the recent predictions), NOTE's instance rule in the first quarter of the
    layers (k = 8, widened per channel to 2.5 observed deviations), a window of 256 samples in
    the shallow half and, in the deep half, a 512-sample window kept to the current domain and
    balanced over the predicted classes.

    Every BN layer becomes a :class:`~dyntta.norm.ClusterAwareBatchNorm2d` with the options of
    the config (module docstring: the rules and their measured motivation). With
    ``compile=True`` it runs eager until its windows keep their size (:meth:`windows_steady`),
    then compiled.
    """

    name = "dyn_adaptive"
    Config = DYNAdaptiveConfig

    def prepare(self, model: nn.Module) -> nn.Module:
        n_layers = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
        c = self.config
        self._clustered = round(c.cluster_fraction * n_layers)
        self._instance = round(c.instance_fraction * n_layers)
        self._built = 0
        self._deep_window = c.window if c.deep_window is None else c.deep_window
        self._shallow_window = c.window if c.shallow_window is None else c.shallow_window
        self._signature = self._filter = None
        if c.deep_match is not None:
            if not self._clustered:
                raise ValueError("deep_match judges samples at the last clustering layer, but "
                                 f"cluster_fraction={c.cluster_fraction} clusters none of the "
                                 f"{n_layers} BN layers: set deep_match=None")
            self._signature = self._filter = WindowMatch(
                self._deep_window, c.window if c.top_up else 0, c.deep_match,
                c.deep_match_reference)
        if c.deep_balance is not None:
            self._filter = ClassBalance(self._deep_window, c.deep_balance, self._signature)
        self._recent = None  # with deep_source_weight="labels": the last predicted classes
        if c.deep_source_weight == "labels" and c.window < 1 and self._clustered < n_layers:
            raise ValueError("deep_source_weight='labels' reads the last `window` predictions: "
                             "it needs window >= 1 (or cluster_fraction=1: no deep layers)")
        return super().prepare(model)

    def make_layer(self, bn):
        c = self.config
        cluster = self._built < self._clustered
        weight = c.source_weight if cluster or c.deep_source_weight == "same" \
            else "set" if c.deep_source_weight == "labels" else c.deep_source_weight
        instance = self._built < self._instance
        layer = ClusterAwareBatchNorm2d(
            bn, c.alpha, c.mix, c.unbiased, merge_levels=c.merge_levels, source_weight=weight,
            prior_strength=c.prior_strength, instance_k=c.instance_k if instance else None,
            instance_spread=c.widening if instance else None, spread_per=c.spread_per,
            instance_around=c.instance_around,
            cluster=cluster, neighbours=c.neighbours if cluster else 0,
            window=self._shallow_window if cluster else self._deep_window,
            top_up=c.top_up,
            signature=self._signature if self._built == self._clustered - 1 else None,
            match=None if cluster else self._filter, fused=c.fused,
        )
        self._built += 1
        return layer

    def windows_steady(self, batch_size: int) -> bool:
        """Whether every window, signature memory and class memory already has the size it keeps
        from here on, for batches of ``batch_size``. Until then the state the network reads
        changes shape from batch to batch, and a compiled network would compile a graph per
        shape (dynamo stops at 8 and runs eager from there)."""
        for m in self.modules():
            if isinstance(m, ClusterAwareBatchNorm2d) and m.window and (
                    m.window_mean is None or m.window_mean.shape[0] < m.window):
                return False
        signature, balance = self._signature, self._filter
        if signature is not None and (signature.current is None or
                                      signature.current.shape[0] != signature.memory + batch_size):
            return False
        return not isinstance(balance, ClassBalance) or (
            balance.classes is not None and balance.classes.shape[0] >= balance.memory)

    @torch.no_grad()
    def step(self, x: torch.Tensor) -> torch.Tensor:
        # compiled: eager while the windows fill, the compiled graph once their shapes hold
        steady = not self.compiled or self.windows_steady(x.shape[0])
        logits = self.model(x) if steady else self.model.forward(x)
        classes = logits.argmax(1)
        if isinstance(self._filter, ClassBalance):
            self._filter.record(classes, logits.shape[1])
        if self.config.deep_source_weight == "labels":
            recent = classes if self._recent is None else torch.cat([self._recent, classes])
            self._recent = recent[-self.config.window :]
            weight = label_balance_weight(self._recent, logits.shape[1],
                                          self.config.balanced_alpha, self.config.balance_power)
            for m in self.modules():
                if isinstance(m, ClusterAwareBatchNorm2d) and m.source_weight == "set":
                    m.set_weight.fill_(weight)
        return logits

    def on_reset(self) -> None:
        self._recent = None
        for m in self.modules():
            if isinstance(m, ClusterAwareBatchNorm2d):
                m.reset_window()
                if m.source_weight == "set":
                    m.set_weight.fill_(m.alpha)
        if isinstance(self._filter, ClassBalance):
            self._filter.reset()
