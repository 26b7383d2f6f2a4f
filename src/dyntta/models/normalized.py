"""Input normalisation that travels with the model, so callers pass images in [0, 1]."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class Normalized(nn.Module):
    """``net((x - mean) / std)`` for images ``x: (B, C, H, W)`` in [0, 1].

    Args:
        net: the classifier proper.
        mean, std: per-channel input statistics (length C); std must be positive.
    """

    def __init__(self, net: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        for name, values in (("mean", mean), ("std", std)):
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                raise ValueError(f"{name} must be a list of numbers, one per channel, got "
                                 f"{values!r}")
        if len(mean) != len(std):
            raise ValueError(f"mean and std differ in length: {len(mean)} vs {len(std)}")
        if any(not s > 0 for s in std):
            raise ValueError(f"std must be positive, got {list(std)}")
        conv = next((m for m in net.modules() if isinstance(m, nn.Conv2d)), None)
        if conv is not None and conv.in_channels != len(mean):
            raise ValueError(f"mean and std have {len(mean)} value(s) but the network takes "
                             f"{conv.in_channels} input channels: give one per channel")
        self.net = net
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.mean.shape[1]:
            raise ValueError(
                f"expected images (B, {self.mean.shape[1]}, H, W), got {tuple(x.shape)}"
            )
        return self.net((x - self.mean) / self.std)
