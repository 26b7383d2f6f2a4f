"""Every named architecture (dyntta's ResNets and the standard TTA source models) and how to
build a network from its spec."""

from __future__ import annotations

from typing import Sequence, Union

from torch import nn

from dyntta.models import resnet
from dyntta.models.mlperf_resnet import MLPerfResNet, MLPerfResNetSpec
from dyntta.models.resnet import ResNet, ResNetSpec
from dyntta.models.resnext import CifarResNeXt, ResNeXtSpec
from dyntta.models.wide_resnet import WideResNet, WideResNetSpec

Spec = Union[ResNetSpec, WideResNetSpec, ResNeXtSpec, MLPerfResNetSpec]

ARCHITECTURES: dict[str, Spec] = {
    **resnet.ARCHITECTURES,
    "wrn28-10": WideResNetSpec(28, 10),
    "wrn40-2": WideResNetSpec(40, 2),
    "resnext29": ResNeXtSpec(29, 4, 32),
    "resnet8-mlperf": MLPerfResNetSpec(),
}
"""Name -> spec. ``wrn28-10``: RobustBench's CIFAR-10 ``Standard``; ``wrn40-2``: AugMix's WRN
(RobustBench ``Hendrycks2020AugMix_WRN``); ``resnext29``: AugMix's ResNeXt-29
(RobustBench ``Hendrycks2020AugMix_ResNeXt``, cardinality 4, base width 32); ``resnet8-mlperf``:
the MLPerf-Tiny image-classification ResNet-8 (:mod:`dyntta.models.mlperf_resnet`)."""

SOURCE_NORMALISATION: dict[str, tuple[Sequence[float], Sequence[float]]] = {
    "wrn28-10": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    "wrn40-2": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "resnext29": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "resnet8-mlperf": ((128 / 255,) * 3, (128 / 255,) * 3),
}
"""(mean, std) the published checkpoints of these architectures were trained with, for images in
[0, 1]: RobustBench's ``Standard`` applies none (``WideResNet(depth=28, widen_factor=10)`` in
robustbench/model_zoo/cifar10.py has no normalisation); AugMix normalises with 0.5 / 0.5
(google-research/augmix ``cifar.py``; RobustBench's ``mu`` / ``sigma`` buffers of
``Hendrycks2020AugMixWRNNet`` / ``Hendrycks2020AugMixResNeXtNet``); the MLPerf-Tiny ResNet-8
is trained on ``(pixel - 128) / 128`` of 0-255 pixels."""

NETWORKS: dict[type, type[nn.Module]] = {
    ResNetSpec: ResNet,
    WideResNetSpec: WideResNet,
    ResNeXtSpec: CifarResNeXt,
    MLPerfResNetSpec: MLPerfResNet,
}


def build_net(spec: Spec, num_classes: int) -> nn.Module:
    """The randomly initialised network of ``spec`` with ``num_classes`` outputs."""
    return NETWORKS[type(spec)](spec, num_classes)


def build(arch: str, num_classes: int = 10) -> nn.Module:
    """Build a named architecture (see ``ARCHITECTURES``), randomly initialised."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; available: {', '.join(ARCHITECTURES)}")
    return build_net(ARCHITECTURES[arch], num_classes)


def arch_name(spec: Spec) -> str | None:
    """The name in ``ARCHITECTURES`` of ``spec``, or None for a custom layout."""
    return next((name for name, s in ARCHITECTURES.items() if s == spec), None)
