"""Wide ResNets (Zagoruyko & Komodakis, BMVC 2016) with RobustBench's parameter names.

RobustBench's ``WideResNet`` (robustbench/model_zoo/architectures/wide_resnet.py, from TRADES)
is the source model of most CIFAR-10-C TTA papers: its ``Standard`` CIFAR-10 model is a
WRN-28-10 (36.5M parameters) that takes images in [0, 1] without normalisation; AugMix's
WRN-40-2 (``Hendrycks2020AugMix_WRN``) has the same layout. Names, so that those state dicts
load as they are: ``conv1``, ``block{1,2,3}.layer.{j}.{bn1,conv1,bn2,conv2,convShortcut}``,
``bn1`` (after the last stage) and ``fc``.

Pre-activation blocks: ``conv2(relu(bn2(conv1(relu(bn1(x))))))`` plus the identity, or, where the
width or stride changes, plus ``convShortcut`` (1x1) applied to ``relu(bn1(x))``. Dropout is
omitted (RobustBench's models use ``dropRate=0``; it is the identity at test time anyway).
"""

from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass(frozen=True)
class WideResNetSpec:
    """WRN-``depth``-``widen_factor``: (depth - 4) / 6 blocks per stage, widths
    16 * widen_factor x (1, 2, 4) after a 16-channel stem."""

    depth: int = 28
    widen_factor: int = 10
    head_bias: bool = True

    def __post_init__(self) -> None:
        if self.depth < 10 or (self.depth - 4) % 6:
            raise ValueError(f"Wide ResNet depth must be 6n + 4 with n >= 1, got {self.depth}")
        if self.widen_factor < 1:
            raise ValueError(f"widen_factor must be >= 1, got {self.widen_factor}")

    @property
    def blocks(self) -> int:
        return (self.depth - 4) // 6


class WideBlock(nn.Module):
    """One pre-activation block; ``convShortcut`` only where the width or stride changes."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.equal_in_out = in_planes == planes  # as RobustBench: stride 2 only where widths change
        if not self.equal_in_out:
            self.convShortcut = nn.Conv2d(in_planes, planes, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(act))))
        return out + (x if self.equal_in_out else self.convShortcut(act))


class WideStage(nn.Module):
    """``layer``: the blocks of one stage (RobustBench's ``NetworkBlock``)."""

    def __init__(self, n: int, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.layer = nn.Sequential(
            *(WideBlock(in_planes if j == 0 else planes, planes, stride if j == 0 else 1)
              for j in range(n))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class WideResNet(nn.Module):
    """A Wide ResNet for (B, 3, H, W) inputs (32x32 for CIFAR), logits (B, num_classes).

    The pooled feature is the mean over the last feature map (RobustBench: an 8x8 average pool,
    the same thing for 32x32 inputs).
    """

    head = "fc"
    """Name of the classifier layer."""

    def __init__(self, spec: WideResNetSpec = WideResNetSpec(), num_classes: int = 10) -> None:
        super().__init__()
        self.spec = spec
        widths = [16 * spec.widen_factor * m for m in (1, 2, 4)]
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.block1 = WideStage(spec.blocks, 16, widths[0], 1)
        self.block2 = WideStage(spec.blocks, widths[0], widths[1], 2)
        self.block3 = WideStage(spec.blocks, widths[1], widths[2], 2)
        self.bn1 = nn.BatchNorm2d(widths[2])
        self.fc = nn.Linear(widths[2], num_classes, bias=spec.head_bias)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled penultimate features (B, 64 * widen_factor)."""
        x = self.block3(self.block2(self.block1(self.conv1(x))))
        return F.relu(self.bn1(x)).mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def is_wide_resnet_layout(state: dict[str, torch.Tensor]) -> bool:
    """Whether ``state`` names its parameters as RobustBench's ``WideResNet`` does."""
    return "block1.layer.0.conv1.weight" in state and "fc.weight" in state


def infer_wide_resnet_spec(state: dict[str, torch.Tensor]) -> WideResNetSpec:
    """The :class:`WideResNetSpec` of a state dict in RobustBench's names."""
    blocks = {int(m[1]) for k in state if (m := re.match(r"block1\.layer\.(\d+)\.", k))}
    width = state["block1.layer.0.conv1.weight"].shape[0]
    if width % 16:
        raise ValueError(f"cannot infer the Wide ResNet: first-stage width {width} is not 16 x k")
    return WideResNetSpec(6 * len(blocks) + 4, width // 16, head_bias="fc.bias" in state)
