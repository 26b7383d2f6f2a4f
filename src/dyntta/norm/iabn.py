"""IABN, NOTE's instance-aware batch normalisation (Gong et al., "NOTE: Robust Continual
Test-time Adaptation Against Temporal Correlation", NeurIPS 2022, Sec. 3.1).

Each sample's instance statistics are kept only where they differ from the reference (batch or
running) statistics by more than ``k`` standard errors of the instance estimate, and are then
shrunk towards the reference by that margin (a soft-shrink):

    s_mu   = sqrt((var_ref + eps) / L)                    L = H * W
    s_var  = (var_ref + eps) * sqrt(2 / (L - 1))
    mean   = mu_ref  + softshrink(mu_i  - mu_ref,  k * s_mu)
    var    = relu(var_ref + softshrink(var_i - var_ref, k * s_var))

with ``softshrink(d, t) = sign(d) * max(|d| - t, 0)``. Feature maps with ``L <= skip_threshold``
(default 1) use the reference statistics unchanged. The formulas, the ``eps`` inside the standard
errors, the unbiased instance and batch variances and the skip threshold follow the authors'
released code (TaesikGong/NOTE, ``utils/iabn.py``; ``--skip_thres`` default 1 in ``main.py``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from dyntta.norm.layers import SourceNorm2d
from dyntta.norm.stats import instance_stats, shrink_to_reference

Reference = Literal["batch", "running", "mode"]


def unbiased_batch_stats(
    inst_mean: torch.Tensor, inst_var: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Channel mean and variance over batch and space, divided by ``B*L - 1`` (0 for one value),
    as NOTE's ``torch.var_mean(x, dim=[0, 2, 3], unbiased=True)``, from the (B, C) instance means
    and biased variances over ``L = H*W`` positions (law of total variance). Each (C,)."""
    n = inst_mean.shape[0] * length
    mean = inst_mean.mean(0)
    var = inst_var.mean(0) + (inst_mean - mean).square().mean(0)
    return mean, var * (n / (n - 1)) if n > 1 else var


class InstanceAwareBatchNorm2d(SourceNorm2d):
    """NOTE's IABN layer built from a source ``nn.BatchNorm2d``.

    Args:
        bn: the source BatchNorm2d (its running statistics, affine parameters and ``eps``).
        k: width of the shrink band in standard errors; 4 in NOTE's reproduction script
            (``tta.sh``: ``iabn_k=4``; the code's argparse default is 3).
        reference: the statistics the instance statistics are shrunk towards:
            ``"batch"`` (default) the current batch's, as IABN in training mode;
            ``"running"`` the running (source) statistics, as IABN in eval mode;
            ``"mode"`` follows ``self.training`` like the released code (batch when training).
        momentum: ``None`` (default) never changes the running statistics. A float ``m`` makes
            every forward that uses batch statistics update them as ``nn.BatchNorm2d`` does,
            ``running = (1 - m) * running + m * batch`` (unbiased variance), which is how NOTE
            tracks target statistics (``--bn_momentum 0.01`` in ``tta.sh``).
        skip_threshold: feature maps with ``H * W <= skip_threshold`` use the reference
            statistics unchanged (the code's ``--skip_thres``, default 1).
    """

    def __init__(
        self,
        bn: nn.BatchNorm2d,
        k: float = 4.0,
        reference: Reference = "batch",
        momentum: float | None = None,
        skip_threshold: int = 1,
    ) -> None:
        super().__init__(bn)
        if not k >= 0:
            raise ValueError(f"k must be >= 0 (shrink width in standard errors), got {k}")
        if reference not in ("batch", "running", "mode"):
            raise ValueError(f"reference must be 'batch', 'running' or 'mode', got {reference!r}")
        if momentum is not None and not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must be None or lie in [0, 1], got {momentum}")
        if skip_threshold < 1:
            raise ValueError(f"skip_threshold must be >= 1, got {skip_threshold}")
        self.k = float(k)
        self.reference = reference
        self.momentum = momentum
        self.skip_threshold = skip_threshold

    def uses_batch_reference(self) -> bool:
        """Whether the next forward shrinks towards the batch statistics."""
        return self.reference == "batch" or (self.reference == "mode" and self.training)

    def reference_stats(
        self, inst_mean: torch.Tensor, inst_var: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Reference ``(mean, var)``, each (C,), from the biased instance statistics (B, C);
        updates the running statistics if asked."""
        if not self.uses_batch_reference():
            return self.running_mean, self.running_var
        mean, var = unbiased_batch_stats(inst_mean, inst_var, length)
        if self.momentum is not None:
            with torch.no_grad():
                self.running_mean.lerp_(mean.detach(), self.momentum)
                self.running_var.lerp_(var.detach(), self.momentum)
        return mean, var

    def statistics(self, x):
        length = x.shape[2] * x.shape[3]
        mean, var = instance_stats(x, unbiased=False)
        ref_mean, ref_var = self.reference_stats(mean, var, length)
        if length <= self.skip_threshold:
            return ref_mean, ref_var
        var = var * (length / (length - 1))  # unbiased, as the code's torch.var_mean
        return shrink_to_reference(mean, var, ref_mean, ref_var, length, self.k, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, k={self.k}, reference={self.reference!r}, "
            f"momentum={self.momentum}, skip_threshold={self.skip_threshold}"
        )
