"""CIFAR ResNeXt (Xie et al., CVPR 2017) with the parameter names of AugMix's and RobustBench's code.

AugMix's CIFAR ResNeXt-29 (google-research/augmix ``third_party/ResNeXt_DenseNet``, from
D-X-Y/ResNeXt-DenseNet) is RobustBench's ``Hendrycks2020AugMix_ResNeXt`` CIFAR-100 model, the
source model of most CIFAR-100-C TTA papers. Both build it with ``cardinality=4, base_width=32``
(``resnext29`` in AugMix, ``Hendrycks2020AugMixResNeXtNet`` in robustbench/model_zoo/cifar100.py):
4 groups of 32 channels in the first stage (the same 128 channels as "32x4d", grouped
differently). Inputs are normalised with mean 0.5 and std 0.5 per channel (AugMix ``cifar.py``;
RobustBench's ``mu`` / ``sigma`` buffers, which the checkpoint file does not hold).

Names: ``conv_1_3x3``, ``bn_1``, ``stage_{1,2,3}.{j}.{conv_reduce,bn_reduce,conv_conv,bn,
conv_expand,bn_expand}``, ``downsample.{0,1}`` (1x1 convolution + BN) and ``classifier``.
Block: ``relu(bn_expand(conv_expand(relu(bn(conv_conv(relu(bn_reduce(conv_reduce(x)))))))) +
shortcut(x))``; ``conv_conv`` is the grouped 3x3 convolution that carries the stride.
"""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict

import torch
from torch import nn
from torch.nn import functional as F

EXPANSION = 4


@dataclasses.dataclass(frozen=True)
class ResNeXtSpec:
    """ResNeXt-``depth``: (depth - 2) / 9 blocks per stage of 64/128/256 planes; a block of
    ``planes`` has ``cardinality`` groups of ``planes * base_width // 64`` channels and
    ``4 * planes`` outputs."""

    depth: int = 29
    cardinality: int = 4
    base_width: int = 32

    def __post_init__(self) -> None:
        if self.depth < 11 or (self.depth - 2) % 9:
            raise ValueError(f"ResNeXt depth must be 9n + 2 with n >= 1, got {self.depth}")
        if self.cardinality < 1 or self.base_width < 1:
            raise ValueError(
                f"cardinality and base_width must be >= 1, got {self.cardinality}, {self.base_width}"
            )

    @property
    def blocks(self) -> int:
        return (self.depth - 2) // 9


class ResNeXtBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int, spec: ResNeXtSpec) -> None:
        super().__init__()
        inner = planes * spec.base_width // 64 * spec.cardinality
        self.conv_reduce = nn.Conv2d(in_planes, inner, 1, bias=False)
        self.bn_reduce = nn.BatchNorm2d(inner)
        self.conv_conv = nn.Conv2d(inner, inner, 3, stride, 1, groups=spec.cardinality, bias=False)
        self.bn = nn.BatchNorm2d(inner)
        self.conv_expand = nn.Conv2d(inner, planes * EXPANSION, 1, bias=False)
        self.bn_expand = nn.BatchNorm2d(planes * EXPANSION)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes * EXPANSION:
            self.downsample = nn.Sequential(OrderedDict([
                ("0", nn.Conv2d(in_planes, planes * EXPANSION, 1, stride, bias=False)),
                ("1", nn.BatchNorm2d(planes * EXPANSION)),
            ]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn_reduce(self.conv_reduce(x)))
        out = F.relu(self.bn(self.conv_conv(out)))
        out = self.bn_expand(self.conv_expand(out))
        return F.relu(out + self.downsample(x))


class CifarResNeXt(nn.Module):
    """A CIFAR ResNeXt for (B, 3, H, W) inputs (32x32), logits (B, num_classes).

    The pooled feature is the mean over the last feature map (the code: an 8x8 average pool, the
    same thing for 32x32 inputs).
    """

    head = "classifier"
    """Name of the classifier layer."""

    def __init__(self, spec: ResNeXtSpec = ResNeXtSpec(), num_classes: int = 100) -> None:
        super().__init__()
        self.spec = spec
        self.conv_1_3x3 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn_1 = nn.BatchNorm2d(64)
        in_planes = 64
        for stage, planes in enumerate((64, 128, 256)):
            blocks = []
            for j in range(spec.blocks):
                stride = 2 if stage > 0 and j == 0 else 1
                blocks.append(ResNeXtBlock(in_planes, planes, stride, spec))
                in_planes = planes * EXPANSION
            self.add_module(f"stage_{stage + 1}", nn.Sequential(*blocks))
        self.classifier = nn.Linear(in_planes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled penultimate features (B, 1024)."""
        x = F.relu(self.bn_1(self.conv_1_3x3(x)))
        x = self.stage_3(self.stage_2(self.stage_1(x)))
        return x.mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def is_resnext_layout(state: dict[str, torch.Tensor]) -> bool:
    """Whether ``state`` names its parameters as AugMix's / RobustBench's CIFAR ResNeXt does."""
    return "conv_1_3x3.weight" in state and "stage_1.0.conv_conv.weight" in state


def infer_resnext_spec(state: dict[str, torch.Tensor]) -> ResNeXtSpec:
    """The :class:`ResNeXtSpec` of a state dict in AugMix's names: the first grouped convolution
    (C, C / cardinality, 3, 3) of the 64-plane stage gives cardinality and base width."""
    blocks = {int(m[1]) for k in state if (m := re.match(r"stage_1\.(\d+)\.", k))}
    inner, group_width = state["stage_1.0.conv_conv.weight"].shape[:2]
    if inner % group_width:
        raise ValueError(
            f"cannot infer the ResNeXt: stage_1.0.conv_conv.weight has shape "
            f"{tuple(state['stage_1.0.conv_conv.weight'].shape)}, {inner} not a multiple of {group_width}"
        )
    return ResNeXtSpec(9 * len(blocks) + 2, inner // group_width, group_width)
