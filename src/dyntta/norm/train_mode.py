"""Batch-statistics BN through PyTorch's native training-mode kernel, for the gradient methods."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from dyntta.norm.layers import TestBatchNorm2d


class TrainModeBatchNorm2d(TestBatchNorm2d):
    """TBN computed by ``F.batch_norm(training=True)`` without running statistics.

    The same statistics (batch mean, biased variance) as :class:`TestBatchNorm2d`, but forward
    and backward run PyTorch's fused BN kernels: the layer that TENT, EATA and SAR train through,
    as their authors' code trains ``nn.BatchNorm2d`` in train mode with
    ``track_running_stats=False``. Running statistics are never updated. A batch of one sample
    on 1x1 maps has one value per channel and no batch statistics: that is an error naming the
    cause (PyTorch's kernel would only say it expected more than one value).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.num_features:
            raise ValueError(
                f"{type(self).__name__} expects (B, {self.num_features}, H, W), "
                f"got {tuple(x.shape)}"
            )
        if x.shape[0] * x.shape[2] * x.shape[3] == 1:
            raise ValueError(
                f"a batch of 1 sample on 1x1 maps gives the {self.num_features}-channel BN "
                "layer one value per channel, no batch statistics: batch-statistics methods "
                "need batches of 2 or more for a model with BN on 1x1 maps"
            )
        return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)
