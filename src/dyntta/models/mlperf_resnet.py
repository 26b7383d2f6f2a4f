"""The MLPerf-Tiny image-classification ResNet-8 ("ResNetv1" of the MLPerf Tiny benchmark,
Banbury et al., 2021), as trained in Keras for CIFAR-10.

A 3x3 stem convolution (16 channels), BN, ReLU; three stages of one basic block each (16 / 32 / 64
channels, strides 1 / 2 / 2): conv3x3 - BN - ReLU - conv3x3 - BN plus the shortcut (identity in
the first stage, a strided 1x1 convolution with bias and no BN in the others), then ReLU; global
average pooling and a linear classifier. Every convolution has a bias; BN layers use Keras'
``eps = 1e-3``. Convolutions pad as TensorFlow's ``"same"`` does, which is not PyTorch's
symmetric padding for strided convolutions (see :func:`same_padding`). Parameter names follow
the PyTorch conversion of the Keras weights: ``conv``, ``bn``, ``stage{1,2,3}.{conv1,bn1,conv2,bn2}``,
``stage{2,3}.shortcut``, ``fc``. The Keras model's final softmax is left out: the network returns
logits. Its inputs are ``(pixel - 128) / 128``, which :func:`dyntta.models.load_checkpoint` applies
(``SOURCE_NORMALISATION["resnet8-mlperf"]``) for images in [0, 1].
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F

KERAS_BN_EPS = 1e-3


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """(before, after) padding of TensorFlow's ``"same"`` along one axis of ``size`` pixels: the
    output has ``ceil(size / stride)`` pixels and the odd pixel of an uneven total goes after
    (a stride-2 3x3 convolution on an even size pads 0 before and 1 after)."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def pad_same(x: torch.Tensor, kernel: int, stride: int) -> torch.Tensor:
    """``x: (B, C, H, W)`` padded with zeros as TensorFlow's ``padding="same"`` pads it for a
    ``kernel`` x ``kernel`` convolution of ``stride``. The convolutions themselves are plain
    ``nn.Conv2d`` without padding, so methods that wrap or re-implement convolutions (ViDA's
    adapters) keep the padding."""
    top, bottom = same_padding(x.shape[-2], kernel, stride)
    left, right = same_padding(x.shape[-1], kernel, stride)
    return F.pad(x, (left, right, top, bottom))


def conv(in_channels: int, out_channels: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    """A convolution with bias and no padding of its own (see :func:`pad_same`)."""
    return nn.Conv2d(in_channels, out_channels, kernel, stride, padding=0, bias=True)


def keras_bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=KERAS_BN_EPS)


class Stage(nn.Module):
    """One basic block: conv3x3 (stride) - BN - ReLU - conv3x3 - BN, plus the shortcut, ReLU."""

    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv1 = conv(in_channels, channels, 3, stride)
        self.bn1 = keras_bn(channels)
        self.conv2 = conv(channels, channels, 3)
        self.bn2 = keras_bn(channels)
        self.shortcut = (nn.Identity() if stride == 1 and in_channels == channels
                         else conv(in_channels, channels, 1, stride))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(pad_same(x, 3, self.stride))))
        out = self.bn2(self.conv2(pad_same(out, 3, 1)))
        return F.relu(out + self.shortcut(x))  # "same" pads nothing for a 1x1 convolution


@dataclasses.dataclass(frozen=True)
class MLPerfResNetSpec:
    """The MLPerf-Tiny ResNet: stem width and one block per stage of ``widths`` (first stride 1,
    then 2)."""

    widths: tuple[int, ...] = (16, 32, 64)


class MLPerfResNet(nn.Module):
    """Images (B, 3, H, W), already scaled as in training, to logits (B, num_classes)."""

    head = "fc"

    def __init__(self, spec: MLPerfResNetSpec = MLPerfResNetSpec(), num_classes: int = 10) -> None:
        super().__init__()
        self.spec = spec
        stem = spec.widths[0]
        self.conv = conv(3, stem, 3)
        self.bn = keras_bn(stem)
        channels = stem
        for i, width in enumerate(spec.widths, 1):
            self.add_module(f"stage{i}", Stage(channels, width, 1 if i == 1 else 2))
            channels = width
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn(self.conv(pad_same(x, 3, 1))))
        for i in range(1, len(self.spec.widths) + 1):
            out = getattr(self, f"stage{i}")(out)
        return self.fc(out.mean(dim=(2, 3)))


def is_mlperf_resnet_layout(state: dict[str, torch.Tensor]) -> bool:
    """Whether ``state`` names its parameters as :class:`MLPerfResNet` does."""
    return {"conv.weight", "bn.weight", "stage1.conv1.weight", "fc.weight"} <= set(state)


def infer_mlperf_resnet_spec(state: dict[str, torch.Tensor]) -> MLPerfResNetSpec:
    """The spec whose stages and widths are those of ``state``."""
    stages = sorted(int(k.split(".")[0][5:]) for k in state if k.endswith(".conv1.weight"))
    if stages != list(range(1, len(stages) + 1)):
        raise ValueError(f"cannot infer the MLPerf ResNet: stages found {stages}")
    return MLPerfResNetSpec(tuple(state[f"stage{s}.conv1.weight"].shape[0] for s in stages))
