"""Shared fixtures: tiny BN networks and the optional real data beside the project."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from dyntta.models import Normalized, ResNet, ResNetSpec

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

if "OMP_NUM_THREADS" not in os.environ:
    # one thread per test process and per process a test starts: the suite runs in two worker
    # processes (pyproject.toml's `-n 2`, pytest-xdist), which then fill two cores without
    # their threads contending
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

TINY_SPEC = ResNetSpec("basic", (1, 1), (4, 8), "B", 4)


def randomize_bn(net: nn.Module) -> nn.Module:
    """Give every BatchNorm2d of ``net`` non-trivial statistics and affine parameters (drawn
    from torch's global generator); returns ``net`` in eval mode."""
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return net.eval()


def tiny_resnet(num_classes: int = 3, seed: int = 0) -> Normalized:
    """A 2-stage ResNet with 4/8 channels and non-trivial BN statistics, in eval mode."""
    torch.manual_seed(seed)
    net = randomize_bn(ResNet(TINY_SPEC, num_classes))
    return Normalized(net, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)).eval()


def random_images(b: int, seed: int = 0, size: int = 8, width: int | None = None) -> torch.Tensor:
    """``b`` seeded uniform RGB images in [0, 1], ``size`` high and ``width`` (default: ``size``)
    wide."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(b, 3, size, size if width is None else width, generator=generator)


@pytest.fixture
def tiny_model() -> Normalized:
    return tiny_resnet()


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "resnet20-cifar10.th").is_file():
        pytest.skip(f"real data not found at {SHARED_DATA}")
    return SHARED_DATA


def tensor_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of ``module.state_dict()`` (without the ``_extra_state`` entries)."""
    return {k: v for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}
