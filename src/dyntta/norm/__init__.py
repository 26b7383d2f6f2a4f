"""Backward-free normalisation layers and the statistics they share. Pure tensor code."""

from dyntta.norm.class_balance import ClassBalance
from dyntta.norm.convert import replace_batchnorm
from dyntta.norm.iabn import InstanceAwareBatchNorm2d
from dyntta.norm.layers import (
    AlphaBatchNorm2d,
    ClusterAwareBatchNorm2d,
    SourceBatchNorm2d,
    SourceNorm2d,
    TestBatchNorm2d,
    normalize,
)
from dyntta.norm.lisc import lisc
from dyntta.norm.robust_bn import RobustBatchNorm2d
from dyntta.norm.stats import batch_stats, cluster_stats, instance_stats
from dyntta.norm.train_mode import TrainModeBatchNorm2d
from dyntta.norm.unmix_tns import UnMixTNS2d
from dyntta.norm.window_match import WindowMatch

__all__ = [
    "AlphaBatchNorm2d",
    "ClassBalance",
    "ClusterAwareBatchNorm2d",
    "InstanceAwareBatchNorm2d",
    "RobustBatchNorm2d",
    "SourceBatchNorm2d",
    "SourceNorm2d",
    "TestBatchNorm2d",
    "TrainModeBatchNorm2d",
    "UnMixTNS2d",
    "WindowMatch",
    "batch_stats",
    "cluster_stats",
    "instance_stats",
    "lisc",
    "normalize",
    "replace_batchnorm",
]
