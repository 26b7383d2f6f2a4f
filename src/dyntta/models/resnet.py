"""ResNets: the CIFAR family, its TTAB / bottleneck relatives, and torchvision's ImageNet layout.

- ResNet-20/32/44/56 (He et al., 2016, Sec. 4.2): basic blocks, 16/32/64 channels, parameter-free
  "option A" shortcuts (stride-2 subsampling plus zero channels); parameter names as in the
  widely used pytorch_resnet_cifar10 checkpoints (``conv1``, ``bn1``, ``layer{1,2,3}.{j}``,
  ``linear``).
- ResNet-26 as in TTAB (LINs-lab/ttab ``ResNetCifar(depth=26)``): 4 basic blocks per stage,
  16/32/64 channels, 1x1-convolution + BN ("option B") shortcuts, bias-free classifier.
- CIFAR ResNet-50: bottleneck blocks [3, 4, 6, 3], widths 64..512 (x4 expansion), a 3x3 stride-1
  stem and no max-pool.
- ImageNet ResNet-18/34/50 in torchvision's layout (a 7x7 stride-2 stem and a 3x3 stride-2
  max-pool, stride on the 3x3 convolution of a bottleneck), so that torchvision's ImageNet
  weights load without torchvision (see :func:`dyntta.models.checkpoint.from_torchvision_names`).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int, shortcut: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = make_shortcut(in_planes, planes, stride, shortcut)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.downsample(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int, shortcut: str) -> None:
        super().__init__()
        out_planes = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.downsample = make_shortcut(in_planes, out_planes, stride, shortcut)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.downsample(x))


class PadShortcut(nn.Module):
    """Option A: subsample by ``stride`` and zero-pad the new channels on both sides."""

    def __init__(self, in_planes: int, out_planes: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        extra = out_planes - in_planes
        self.pad = (extra // 2, extra - extra // 2)

    def forward(self, x):
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, *self.pad))


def make_shortcut(in_planes: int, out_planes: int, stride: int, kind: str) -> nn.Module:
    if stride == 1 and in_planes == out_planes:
        return nn.Identity()
    if kind == "A":
        return PadShortcut(in_planes, out_planes, stride)
    return nn.Sequential(
        OrderedDict(
            conv=nn.Conv2d(in_planes, out_planes, 1, stride, bias=False),
            bn=nn.BatchNorm2d(out_planes),
        )
    )


@dataclasses.dataclass(frozen=True)
class ResNetSpec:
    """Everything that fixes a ResNet's parameter shapes and names."""

    block: Literal["basic", "bottleneck"]
    blocks: tuple[int, ...]
    widths: tuple[int, ...]
    shortcut: Literal["A", "B"]
    stem: int
    head_bias: bool = True
    imagenet_stem: bool = False
    """7x7 stride-2 stem convolution and 3x3 stride-2 max-pool (ImageNet) instead of 3x3 stride 1."""


ARCHITECTURES: dict[str, ResNetSpec] = {
    **{
        f"resnet{6 * n + 2}": ResNetSpec("basic", (n, n, n), (16, 32, 64), "A", 16)
        for n in (3, 5, 7, 9)
    },
    "resnet26": ResNetSpec("basic", (4, 4, 4), (16, 32, 64), "B", 16, head_bias=False),
    "resnet50": ResNetSpec("bottleneck", (3, 4, 6, 3), (64, 128, 256, 512), "B", 64),
    **{
        f"resnet{depth}-imagenet": ResNetSpec(
            block, blocks, (64, 128, 256, 512), "B", 64, imagenet_stem=True
        )
        for depth, block, blocks in (
            (18, "basic", (2, 2, 2, 2)),
            (34, "basic", (3, 4, 6, 3)),
            (50, "bottleneck", (3, 4, 6, 3)),
        )
    },
}


class ResNet(nn.Module):
    """A ResNet built from a :class:`ResNetSpec`. Input: (B, 3, H, W)."""

    head = "linear"
    """Name of the classifier layer."""

    def __init__(self, spec: ResNetSpec, num_classes: int = 10) -> None:
        super().__init__()
        self.spec = spec
        block = BasicBlock if spec.block == "basic" else Bottleneck
        kernel, stride, padding = (7, 2, 3) if spec.imagenet_stem else (3, 1, 1)
        self.conv1 = nn.Conv2d(3, spec.stem, kernel, stride, padding, bias=False)
        self.bn1 = nn.BatchNorm2d(spec.stem)
        self.pool = nn.MaxPool2d(3, 2, 1) if spec.imagenet_stem else nn.Identity()
        in_planes = spec.stem
        for stage, (n, width) in enumerate(zip(spec.blocks, spec.widths)):
            layers = []
            for j in range(n):
                stride = 2 if stage > 0 and j == 0 else 1
                layers.append(block(in_planes, width, stride, spec.shortcut))
                in_planes = width * block.expansion
            self.add_module(f"layer{stage + 1}", nn.Sequential(*layers))
        self.linear = nn.Linear(in_planes, num_classes, bias=spec.head_bias)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled penultimate features (B, D)."""
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        for stage in range(len(self.spec.blocks)):
            x = getattr(self, f"layer{stage + 1}")(x)
        return x.mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.features(x))

