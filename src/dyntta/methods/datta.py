"""DATTA's normalisation (DABN with the domain-diversity score), backward-free.

Ye, Wei et al., "DATTA: Domain Diversity Aware Test-Time Adaptation for Dynamic Domain Shift
Stream", ICME 2025 (the DYN authors' group); released code DYW77/DATTA
(``ttab/model_adaptation/datta.py``, ``utils.py``). Followed here:

- Score, at the input x of the first BN layer: per sample, the mean over positions of the cosine
  (over channels) between ``mu_src - x`` and ``mu_batch - x``; its arccos; the score is the
  (population) standard deviation of these angles over the batch (``sum_angle``).
- Decision: every score is appended to a cache (which starts as ``[0]``; that 0 is dropped once the
  cache holds more than 50 entries). Until then the batch is "multi-domain". After, a Gaussian KDE
  (Scott's bandwidth) of the cache on 1000 points locates its two highest peaks and the lowest
  valley between them; the batch is "single-domain" when the two peak densities are within a
  factor 2 and the score lies below the valley (``select_area = "1&2"``, the setting of every run
  logged in the repository), else "multi-domain".
- DABN in every BN layer: ``prior * source + (1 - prior) * batch`` for mean and variance, batch
  variance unbiased (``torch.var_mean(unbiased=True)``), prior 0.6 single-domain, 0.85 multi.

Not included: DAFT, the entropy fine-tuning of the BN affine parameters on single-domain batches
(a backward pass; this is the backward-free part the DYN successor is compared with). The code
names the modes "homo"/"heter" in ``datta.py`` and "single"/"multiple" in ``DABN``; they are read
as the same two modes. Angles are clamped to the domain of arccos (the code would give NaN).
The decision runs on the host (NumPy/SciPy), as in the code. It is taken before the network
runs: a probe runs the network eagerly up to the first BN layer's input (the stem, computed twice)
and stops there; the network then runs whole with the chosen prior in a buffer, so a compiled
network (``compile=True``) is one graph with no host round trip.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from dyntta.methods.base import check_unit_interval
from dyntta.methods.normalization import NormalizationMethod
from dyntta.methods.registry import register
from dyntta.norm import SourceNorm2d
from dyntta.norm.iabn import unbiased_batch_stats
from dyntta.norm.layers import mix
from dyntta.norm.stats import instance_stats


class DomainDiversityBatchNorm2d(SourceNorm2d):
    """DABN: batch statistics mixed with the source's at source weight ``prior``, a 0-dim buffer
    (set per batch with ``prior.fill_``, so a compiled network reads it without recompiling)."""

    def __init__(self, bn: nn.BatchNorm2d, prior: float) -> None:
        super().__init__(bn)
        self.register_buffer("prior", torch.tensor(prior), persistent=False)

    def statistics(self, x):
        mean, var = instance_stats(x, unbiased=False)
        mean, var = unbiased_batch_stats(mean, var, x.shape[2] * x.shape[3])
        return mix(self.running_mean, mean, self.prior), mix(self.running_var, var, self.prior)


class _Probed(Exception):
    """Carries the first BN layer's input out of the probe forward."""

    def __init__(self, x: torch.Tensor) -> None:
        super().__init__()
        self.x = x


def _stop(layer: nn.Module, args: tuple) -> None:
    raise _Probed(args[0])


def first_input(model: nn.Module, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The input ``layer`` receives when ``model`` runs on ``x``, computed eagerly (``forward``,
    not a compiled call) and stopping there."""
    handle = layer.register_forward_pre_hook(_stop)
    try:
        model.forward(x)
    except _Probed as probed:
        return probed.x
    finally:
        handle.remove()
    raise ValueError(f"{type(layer).__name__} is never called by the model's forward")


def diversity_score(x: torch.Tensor, source_mean: torch.Tensor) -> float:
    """DATTA's domain-diversity score of a batch ``x: (B, C, H, W)`` at a BN input (radians)."""
    batch_mean = x.mean(dim=(0, 2, 3)).view(1, -1, 1, 1)
    cos = F.cosine_similarity(source_mean.view(1, -1, 1, 1) - x, batch_mean - x, dim=1, eps=1e-10)
    angles = torch.arccos(cos.flatten(1).mean(1).clamp(-1.0, 1.0))
    return float(angles.std(unbiased=False))


def is_single_domain(cache: list[float], score: float, ratio: float = 2.0) -> bool:
    """DATTA's decision from the score cache (see the module docstring)."""
    from scipy.signal import find_peaks  # imported here: scipy.signal takes seconds to import
    from scipy.stats import gaussian_kde

    data = np.asarray(cache)
    if data.min() == data.max():
        return False  # no spread: no two peaks (the code's KDE would fail here)
    xs = np.linspace(data.min(), data.max(), 1000)
    density = gaussian_kde(data)(xs)
    peaks, _ = find_peaks(density)
    if len(peaks) < 2:
        return False  # peak densities 0: ratio infinite
    top = np.sort(peaks[np.argsort(density[peaks])[-2:]])
    if not 1 / ratio <= density[top[0]] / density[top[1]] <= ratio:
        return False
    valleys, _ = find_peaks(-density)
    between = [v for v in valleys if xs[top[0]] < xs[v] < xs[top[1]]]
    valley = xs[min(between, key=lambda v: density[v])] if between else 0.0
    return score < valley


@dataclasses.dataclass(frozen=True)
class DATTAConfig:
    """Hyper-parameters of DATTA (released code, ``utils.py`` ``DABN`` and ``datta.py``).

    single_prior: source weight on single-domain batches, 0.6.
    multi_prior: source weight on multi-domain batches, 0.85.
    warmup: scores collected before the KDE decides, 50 (``len(cache) > 50``).
    density_ratio: the two peaks' densities must lie within this factor, 2.
    """

    single_prior: float = 0.6
    multi_prior: float = 0.85
    warmup: int = 50
    density_ratio: float = 2.0

    def __post_init__(self):
        check_unit_interval("single_prior", self.single_prior)
        check_unit_interval("multi_prior", self.multi_prior)
        if self.warmup < 2:
            raise ValueError(f"warmup must be >= 2 scores, got {self.warmup}")
        if not self.density_ratio >= 1:
            raise ValueError(f"density_ratio must be >= 1, got {self.density_ratio}")


@register
class DATTA(NormalizationMethod):
    """DABN in every BN layer; the first BN layer's input decides the prior of the batch."""

    name = "datta"
    Config = DATTAConfig

    def make_layer(self, bn):
        return DomainDiversityBatchNorm2d(bn, self.config.multi_prior)

    def prepare(self, model: nn.Module) -> nn.Module:
        model = super().prepare(model)
        self.layers = [m for m in model.modules() if isinstance(m, DomainDiversityBatchNorm2d)]
        return model

    def on_reset(self) -> None:
        self.cache: list[float] = [0.0]
        self.last_single: bool | None = None

    def before_forward(self, x: torch.Tensor) -> None:
        self._decide(first_input(self.model, self.layers[0], x))

    def _decide(self, first_bn_input: torch.Tensor) -> None:
        score = diversity_score(first_bn_input, self.layers[0].running_mean)
        self.cache.append(score)
        single = False
        if len(self.cache) > self.config.warmup:
            if self.cache[0] == 0.0:
                self.cache.pop(0)
            single = is_single_domain(self.cache, score, self.config.density_ratio)
        self.last_single = single
        prior = self.config.single_prior if single else self.config.multi_prior
        for layer in self.layers:
            layer.prior.fill_(prior)
