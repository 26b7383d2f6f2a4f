"""Shared base for test-time normalisation methods: swap every BN layer, then just predict."""

from __future__ import annotations

import torch
from torch import nn

from dyntta.methods.base import Method
from dyntta.norm import replace_batchnorm


class NormalizationMethod(Method):
    """A backward-free method defined by the layer that replaces each ``nn.BatchNorm2d``."""

    def make_layer(self, bn: nn.BatchNorm2d) -> nn.Module:
        raise NotImplementedError

    def prepare(self, model: nn.Module) -> nn.Module:
        replace_batchnorm(model, self.make_layer)
        model.eval()
        model.requires_grad_(False)
        return model

    @torch.no_grad()
    def step(self, x: torch.Tensor) -> torch.Tensor:
        self.before_forward(x)
        return self.model(x)

    def before_forward(self, x: torch.Tensor) -> None:
        """Set what the adapted network reads for the batch ``x``, before it runs (methods
        whose layers follow decisions made from the whole batch; default: nothing)."""
