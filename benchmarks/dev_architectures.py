"""Source models of other shapes than dyntta's ResNets, trained here, to check that a method's
rules carry across architectures (the ResNet-20 and the MLPerf-Tiny ResNet-8 are the others).

- ``vgg_bn_after_relu``: a VGG-style net whose BN layers follow the ReLU (conv-ReLU-BN), 6 BN
  layers, no shortcuts;
- ``depthwise_net``: a MobileNet-style net (Howard et al., 2017) of depthwise-separable blocks,
  BN after every depthwise and pointwise convolution, 11 BN layers;
- ``wide_resnet``: a pre-activation wide ResNet, WRN-16-2 (Zagoruyko and Komodakis, BMVC 2016;
  the layout of the WRN-28-10 most TTA papers adapt on CIFAR-10-C), BN before every
  convolution and before the pooling, 13 BN layers;
- ``resnet18_quarter``: the CIFAR ResNet-18 of most CIFAR code bases (four stages of two basic
  blocks, maps of 32 down to 4 pixels; a 1x1 convolution and BN on each downsampling
  shortcut) at a quarter of its width, 20 BN layers;
- ``convmixer``: a ConvMixer (Trockman and Kolter, "Patches Are All You Need?", TMLR 2023):
  a 2x2 patch embedding, then depthwise and pointwise convolutions at one width and one map
  size throughout (no downsampling stages), each followed by GELU then BN, 13 BN layers;
- ``densenet``: a DenseNet-BC (Huang et al., CVPR 2017) of three dense blocks whose layers
  normalise the concatenation of every earlier layer's features (BN-ReLU-1x1 conv-BN-ReLU-3x3
  conv), growth 12, four layers a block, 27 BN layers.

Each factory returns an untrained model for images in [0, 1] (``dyntta bench --model
benchmarks.dev_architectures:NAME --checkpoint FILE`` from the repository root loads the trained
weights and input normalisation into it). This script trains them on one half of the CIFAR-10
test images (the even rows of the npz; its rows are sorted by class, so each half holds every
class alike) and writes the other half (the odd rows) for testing, so no test image was seen in
training. Training runs on one thread unless ``--threads`` says otherwise, so the same kind of
CPU always trains the same weights; another kind trains others. The checkpoints behind RESULTS.md
are in ``results/dev_models/``: ``--models`` with no name writes the test half alone, for them:

    PYTHONPATH=src python benchmarks/dev_architectures.py ../shared/data/cifar10-test-jpeg.npz \\
        --out ../dev-models --models
    cp results/dev_models/*.pt ../dev-models/
    dyntta bench --config configs/dev_architectures.toml --data-dir ../dev-models
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dyntta.atomic import atomic_path
from dyntta.bench.train import train_classifier
from dyntta.data.datasets import to_tensor
from dyntta.models import Normalized
from dyntta.models.checkpoint import save_atomic
from dyntta.models.cli import ROWS


class PooledClassifier(nn.Module):
    """``features``, then a global average pool and a linear layer from ``width`` channels."""

    def __init__(self, features: list[nn.Module], width: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(*features)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3)))


def residual_stages(block: type[nn.Module], c_in: int, stages: tuple[tuple[int, int], ...],
                    blocks: int) -> tuple[list[nn.Module], int]:
    """``blocks`` blocks ``block(c_in, c_out, stride)`` per ``(c_out, stride)`` stage, the
    stride on each stage's first; the blocks and their output width."""
    layers: list[nn.Module] = []
    for c_out, stride in stages:
        for i in range(blocks):
            layers.append(block(c_in, c_out, stride if i == 0 else 1))
            c_in = c_out
    return layers, c_in


def conv_relu_bn(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.ReLU(inplace=True),
            nn.BatchNorm2d(c_out)]


class VGGBNAfterReLU(PooledClassifier):
    """conv-ReLU-BN x2, max-pool, at 32, 64 and 128 channels; global average pool; linear."""

    def __init__(self, num_classes: int = 10) -> None:
        layers: list[nn.Module] = []
        c_in = 3
        for width in (32, 64, 128):
            layers += [*conv_relu_bn(c_in, width), *conv_relu_bn(width, width), nn.MaxPool2d(2)]
            c_in = width
        super().__init__(layers, c_in, num_classes)


def conv_bn_relu(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1):
    return [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]


class DepthwiseNet(PooledClassifier):
    """A 3x3 stem at 32 channels, then five depthwise-separable blocks (3x3 depthwise-BN-ReLU,
    1x1 pointwise-BN-ReLU) to 64, 128 (stride 2), 128, 256 (stride 2) and 256 channels; global
    average pool; linear."""

    BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1))

    def __init__(self, num_classes: int = 10) -> None:
        layers = conv_bn_relu(3, 32, 3)
        c_in = 32
        for c_out, stride in self.BLOCKS:
            layers += [*conv_bn_relu(c_in, c_in, 3, stride, groups=c_in),
                       *conv_bn_relu(c_in, c_out, 1)]
            c_in = c_out
        super().__init__(layers, c_in, num_classes)


class PreActBlock(nn.Module):
    """BN-ReLU-conv twice around an identity shortcut; where the width or the stride changes,
    the shortcut is a 1x1 convolution of the first BN-ReLU's output (as in the WRN authors'
    code)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm2d(c_in), nn.BatchNorm2d(c_out)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.shortcut = (None if c_in == c_out and stride == 1
                         else nn.Conv2d(c_in, c_out, 1, stride, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        activated = torch.relu(self.bn1(x))
        out = self.conv2(torch.relu(self.bn2(self.conv1(activated))))
        return out + (x if self.shortcut is None else self.shortcut(activated))


class WideResNet(PooledClassifier):
    """WRN-16-2: a 3x3 stem at 16 channels, two pre-activation blocks at each of 32, 64 (stride
    2) and 128 (stride 2) channels, BN-ReLU, global average pool, linear."""

    STAGES = ((32, 1), (64, 2), (128, 2))

    def __init__(self, num_classes: int = 10, blocks: int = 2) -> None:
        stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        layers, width = residual_stages(PreActBlock, 16, self.STAGES, blocks)
        super().__init__([stem, *layers, nn.BatchNorm2d(width), nn.ReLU(inplace=True)], width,
                         num_classes)


class BasicBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the shortcut (identity, or 1x1 conv-BN where the width or the
    stride changes), then ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.residual = nn.Sequential(*conv_bn_relu(c_in, c_out, 3, stride),
                                      nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(c_out))
        self.shortcut = nn.Identity() if c_in == c_out and stride == 1 else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.residual(x) + self.shortcut(x))


class ResNet18Quarter(PooledClassifier):
    """A 3x3 stem at 16 channels, two basic blocks at each of 16, 32 (stride 2), 64 (stride 2)
    and 128 (stride 2) channels, global average pool, linear."""

    STAGES = ((16, 1), (32, 2), (64, 2), (128, 2))

    def __init__(self, num_classes: int = 10, blocks: int = 2) -> None:
        stem = conv_bn_relu(3, 16, 3)
        layers, width = residual_stages(BasicBlock, 16, self.STAGES, blocks)
        super().__init__([*stem, *layers], width, num_classes)


class DepthwiseResidual(nn.Module):
    """``x + GELU-BN(depthwise conv(x))``: ConvMixer's spatial mixing."""

    def __init__(self, width: int, kernel: int) -> None:
        super().__init__()
        self.mix = nn.Sequential(nn.Conv2d(width, width, kernel, padding=kernel // 2,
                                           groups=width), nn.GELU(), nn.BatchNorm2d(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mix(x)


class ConvMixer(PooledClassifier):
    """ConvMixer-128/6: a 2x2 patch embedding to 128 channels at 16 x 16, then six blocks of a
    residual 5x5 depthwise convolution and a 1x1 pointwise one, each conv-GELU-BN; global
    average pool; linear."""

    def __init__(self, num_classes: int = 10, width: int = 128, depth: int = 6,
                 kernel: int = 5, patch: int = 2) -> None:
        layers: list[nn.Module] = [nn.Conv2d(3, width, patch, patch), nn.GELU(),
                                   nn.BatchNorm2d(width)]
        for _ in range(depth):
            layers += [DepthwiseResidual(width, kernel), nn.Conv2d(width, width, 1), nn.GELU(),
                       nn.BatchNorm2d(width)]
        super().__init__(layers, width, num_classes)


class DenseLayer(nn.Module):
    """DenseNet-BC's bottleneck layer: its input, then ``growth`` new channels from
    BN-ReLU-1x1 conv (to ``4 * growth``)-BN-ReLU-3x3 conv of it."""

    def __init__(self, c_in: int, growth: int) -> None:
        super().__init__()
        self.new = nn.Sequential(
            nn.BatchNorm2d(c_in), nn.ReLU(inplace=True),
            nn.Conv2d(c_in, 4 * growth, 1, bias=False),
            nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True),
            nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.new(x)], 1)


class DenseNet(PooledClassifier):
    """DenseNet-BC: a 3x3 stem at ``2 * growth`` channels, three dense blocks of ``layers``
    :class:`DenseLayer` at 32, 16 and 8 pixels, each of the first two followed by a transition
    (BN-ReLU-1x1 conv to half the channels, 2x2 average pool), BN-ReLU, global average pool,
    linear."""

    def __init__(self, num_classes: int = 10, growth: int = 12, layers: int = 4) -> None:
        width = 2 * growth
        modules: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1, bias=False)]
        for block in range(3):
            for _ in range(layers):
                modules.append(DenseLayer(width, growth))
                width += growth
            if block < 2:
                modules += [nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                            nn.Conv2d(width, width // 2, 1, bias=False), nn.AvgPool2d(2)]
                width //= 2
        super().__init__([*modules, nn.BatchNorm2d(width), nn.ReLU(inplace=True)], width,
                         num_classes)


def untrained(net: nn.Module) -> Normalized:
    """``net`` for images in [0, 1], behind a placeholder input normalisation that a checkpoint
    replaces."""
    return Normalized(net, [0.5] * 3, [0.25] * 3)


def vgg_bn_after_relu() -> Normalized:
    """An untrained :class:`VGGBNAfterReLU` (:func:`untrained`)."""
    return untrained(VGGBNAfterReLU())


def depthwise_net() -> Normalized:
    """An untrained :class:`DepthwiseNet` (:func:`untrained`)."""
    return untrained(DepthwiseNet())


def wide_resnet() -> Normalized:
    """An untrained :class:`WideResNet` (:func:`untrained`)."""
    return untrained(WideResNet())


def resnet18_quarter() -> Normalized:
    """An untrained :class:`ResNet18Quarter` (:func:`untrained`)."""
    return untrained(ResNet18Quarter())


def convmixer() -> Normalized:
    """An untrained :class:`ConvMixer` (:func:`untrained`)."""
    return untrained(ConvMixer())


def densenet() -> Normalized:
    """An untrained :class:`DenseNet` (:func:`untrained`)."""
    return untrained(DenseNet())


FACTORIES = {"vgg_bn_after_relu": vgg_bn_after_relu, "depthwise_net": depthwise_net,
             "wide_resnet": wide_resnet, "resnet18_quarter": resnet18_quarter,
             "convmixer": convmixer, "densenet": densenet}


def accuracy(model: nn.Module, images: np.ndarray, labels: np.ndarray) -> float:
    with torch.no_grad():
        hits = [(model(to_tensor(images[i : i + 500])).argmax(1).numpy() == labels[i : i + 500])
                for i in range(0, len(images), 500)]
    return float(np.concatenate(hits).mean())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("npz", help="the CIFAR-10 test images (x uint8 (N, 32, 32, 3), y)")
    parser.add_argument("--out", required=True, help="folder for the checkpoints and test half")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--models", nargs="*", default=list(FACTORIES), choices=list(FACTORIES))
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for training (default 1): another count sums in "
                             "another order and trains other weights")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        train_and_save(args)
    finally:
        torch.set_num_threads(threads)


def train_and_save(args: argparse.Namespace) -> None:
    """Write the test half and train, save and report each of ``args.models``."""
    data = np.load(args.npz)
    x, y = data["x"], data["y"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train, test = ROWS["even"], ROWS["odd"]  # the halves `dyntta refresh --rows` names
    with atomic_path(out / "cifar10-test-half.npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, x=x[test], y=y[test])
    for name in args.models:
        torch.manual_seed(0)
        net = FACTORIES[name]().net
        model = train_classifier(x[train], y[train], net, epochs=args.epochs,
                                 lr=0.05, crop_pad=4, seed=0)
        save_atomic(model.state_dict(), out / f"{name}.pt")
        print(f"{name}: clean accuracy on the test half "
              f"{100 * accuracy(model, x[test], y[test]):.2f}%", flush=True)


if __name__ == "__main__":
    main()
