"""Architectures (CIFAR ResNets, TTAB ResNet-26, ImageNet ResNets, RobustBench's Wide ResNets,
AugMix's ResNeXt), checkpoint loading and BN statistics re-estimated on clean images."""

from dyntta.models.checkpoint import infer_spec, load_checkpoint, save_checkpoint
from dyntta.models.normalized import Normalized
from dyntta.models.refresh import refresh_statistics, statistics_hits
from dyntta.models.resnet import ResNet, ResNetSpec
from dyntta.models.resnext import CifarResNeXt, ResNeXtSpec
from dyntta.models.wide_resnet import WideResNet, WideResNetSpec
from dyntta.models.zoo import ARCHITECTURES, build, build_net

__all__ = [
    "ARCHITECTURES",
    "CifarResNeXt",
    "Normalized",
    "ResNeXtSpec",
    "ResNet",
    "ResNetSpec",
    "WideResNet",
    "WideResNetSpec",
    "build",
    "build_net",
    "infer_spec",
    "load_checkpoint",
    "refresh_statistics",
    "save_checkpoint",
    "statistics_hits",
]
