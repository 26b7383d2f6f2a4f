"""Load and save classifier checkpoints, inferring the architecture from the state dict.

Two formats are read:

- dyntta's own (written by :func:`save_checkpoint`): architecture, classes and input
  normalisation travel with the weights.
- a bare state dict, or ``{"state_dict": ...}`` as in pytorch_resnet_cifar10 (keys may carry the
  ``module.`` prefix of ``nn.DataParallel``; ``num_batches_tracked`` may be absent). The
  architecture is inferred from parameter names and shapes. torchvision's ResNet names (``fc``,
  ``downsample.0`` / ``downsample.1``) are translated, so its ImageNet weights load as they are.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from dyntta.atomic import atomic_path
from dyntta.models.normalized import Normalized
from dyntta.models.resnet import ARCHITECTURES, ResNet, ResNetSpec

FORMAT = "dyntta-checkpoint/1"

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
"""torchvision's ImageNet models and pytorch_resnet_cifar10 (Idelbayev, 2018) normalise inputs
with these statistics; they are the default for bare state dicts of torchvision ResNets and of
option-A CIFAR ResNets."""

TORCHVISION_NAMES = ((r"^fc\.", "linear."), (r"\.downsample\.0\.", ".downsample.conv."),
                     (r"\.downsample\.1\.", ".downsample.bn."))
"""(torchvision pattern, dyntta name) for the parameter names that differ between the layouts."""


def strip_prefix(state: dict[str, torch.Tensor], prefix: str = "module.") -> dict:
    """Drop ``prefix`` from every key that has it (``nn.DataParallel`` checkpoints)."""
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


def is_torchvision_layout(state: dict[str, torch.Tensor]) -> bool:
    """Whether ``state`` names its parameters as torchvision's ResNets do (classifier ``fc``)."""
    return "fc.weight" in state and "linear.weight" not in state


def from_torchvision_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename torchvision ResNet parameters (``fc``, ``downsample.0/1``) to dyntta's."""
    renamed = {}
    for key, value in state.items():
        for pattern, ours in TORCHVISION_NAMES:
            key = re.sub(pattern, ours, key)
        renamed[key] = value
    return renamed


def infer_spec(state: dict[str, torch.Tensor]) -> ResNetSpec:
    """The :class:`ResNetSpec` whose parameters have the names and shapes of ``state``."""
    if "conv1.weight" not in state or "linear.weight" not in state:
        raise ValueError(
            "cannot infer the architecture: expected keys 'conv1.weight' and 'linear.weight' "
            f"(a ResNet of dyntta.models); first keys found: {sorted(state)[:6]}"
        )
    blocks: dict[int, set[int]] = {}
    for key in state:
        m = re.match(r"layer(\d+)\.(\d+)\.", key)
        if m:
            blocks.setdefault(int(m[1]), set()).add(int(m[2]))
    stages = sorted(blocks)
    if not stages or stages != list(range(1, len(stages) + 1)):
        raise ValueError(f"cannot infer the architecture: residual stages found {stages}")
    bottleneck = "layer1.0.conv3.weight" in state
    widths = tuple(state[f"layer{s}.0.conv1.weight"].shape[0] for s in stages)
    return ResNetSpec(
        block="bottleneck" if bottleneck else "basic",
        blocks=tuple(len(blocks[s]) for s in stages),
        widths=widths,
        shortcut="B" if any(".downsample." in k for k in state) else "A",
        stem=state["conv1.weight"].shape[0],
        head_bias="linear.bias" in state,
        imagenet_stem=state["conv1.weight"].shape[-1] == 7,
    )


def arch_name(spec: ResNetSpec) -> str | None:
    """The name in ``ARCHITECTURES`` of ``spec``, or None for a custom layout."""
    return next((name for name, s in ARCHITECTURES.items() if s == spec), None)


def load_state_checked(net: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """``load_state_dict`` that tolerates only absent ``num_batches_tracked`` buffers and
    reports every other missing or unexpected key and every shape mismatch."""
    own = net.state_dict()
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in own]
    mismatched = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in state.items()
        if k in own and v.shape != own[k].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if mismatched:
        problems.append(f"shape mismatches {mismatched}")
    if problems:
        raise ValueError(f"{source} does not fit the model: " + "; ".join(problems))
    net.load_state_dict(state, strict=False)


def load_checkpoint(
    path: str | os.PathLike,
    arch: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> Normalized:
    """Load a classifier for images in [0, 1], ready for :func:`dyntta.adapt`.

    Args:
        path: a dyntta checkpoint or a (possibly ``{"state_dict": ...}``-wrapped) state dict.
        arch: a name from ``ARCHITECTURES`` to insist on; inferred from the state dict if None.
        mean, std: input normalisation; overrides the checkpoint's. Required for a bare state
            dict unless it is a torchvision ResNet or an option-A CIFAR ResNet (then ImageNet
            statistics, which both train with).

    Returns:
        A :class:`Normalized` model in eval mode.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        blob: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling errors come in many types
        raise ValueError(f"{path} is not a readable torch checkpoint: {exc}") from exc
    if not isinstance(blob, dict):
        raise ValueError(f"{path}: expected a dict (state dict or checkpoint), got {type(blob)}")
    own_format = blob.get("format") == FORMAT
    state = blob.get("state_dict", blob)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: no state dict of tensors found")
    state = strip_prefix(state)
    torchvision = is_torchvision_layout(state)
    if torchvision:
        state = from_torchvision_names(state)
    if arch is None:
        spec = infer_spec(state)
    elif arch in ARCHITECTURES:
        spec = ARCHITECTURES[arch]
    else:
        raise ValueError(f"unknown architecture {arch!r}; available: {', '.join(ARCHITECTURES)}")
    if "linear.weight" not in state:
        raise ValueError(f"{path}: no classifier weights 'linear.weight' in the state dict")
    net = ResNet(spec, num_classes=state["linear.weight"].shape[0])
    load_state_checked(net, state, str(path))
    if mean is None or std is None:
        if own_format:
            mean, std = blob["mean"], blob["std"]
        elif spec.shortcut == "A" or torchvision:
            mean, std = IMAGENET_MEAN, IMAGENET_STD
        else:
            raise ValueError(
                f"{path} carries no input normalisation; pass mean=... and std=... "
                "(per-channel statistics of the training images in [0, 1])"
            )
    model = Normalized(net, mean, std)
    model.classes = list(blob.get("classes") or []) if own_format else []
    return model.eval()


def save_checkpoint(
    model: Normalized, path: str | os.PathLike, classes: Sequence[str] | None = None
) -> None:
    """Write ``model`` with its architecture, classes and normalisation, atomically."""
    if not isinstance(model, Normalized) or not isinstance(model.net, ResNet):
        raise ValueError("save_checkpoint expects Normalized(ResNet) from dyntta.models")
    blob = {
        "format": FORMAT,
        "arch": arch_name(model.net.spec),
        "mean": model.mean.flatten().tolist(),
        "std": model.std.flatten().tolist(),
        "classes": list(classes or []),
        "state_dict": model.net.state_dict(),
    }
    with atomic_path(path) as tmp:
        torch.save(blob, tmp)
