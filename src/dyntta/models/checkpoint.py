"""Load and save classifier checkpoints, inferring the architecture from the state dict.

Two formats are read:

- dyntta's own (written by :func:`save_checkpoint`): architecture, classes and input
  normalisation travel with the weights.
- a bare state dict, ``{"state_dict": ...}`` as in pytorch_resnet_cifar10 and RobustBench, or
  ``{"model": ...}`` as in TTAB (keys may carry the ``module.`` prefix of ``nn.DataParallel``, or
  ``model.`` on every key; ``num_batches_tracked`` may be absent). The architecture is inferred
  from parameter names and shapes: dyntta's ResNets, RobustBench's Wide ResNets
  (:mod:`dyntta.models.wide_resnet`), AugMix's CIFAR ResNeXt (:mod:`dyntta.models.resnext`) and
  the MLPerf-Tiny ResNet-8 (:mod:`dyntta.models.mlperf_resnet`) by their own names; torchvision's ResNet names (``fc``, ``downsample.0`` / ``downsample.1``) and
  TTAB's (``classifier``) are translated, so those weights load as they are.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from dyntta.atomic import write_atomic
from dyntta.models.mlperf_resnet import infer_mlperf_resnet_spec, is_mlperf_resnet_layout
from dyntta.models.normalized import Normalized
from dyntta.models.resnet import ResNetSpec
from dyntta.models.resnext import infer_resnext_spec, is_resnext_layout
from dyntta.models.wide_resnet import infer_wide_resnet_spec, is_wide_resnet_layout
from dyntta.models.zoo import (
    ARCHITECTURES,
    NETWORKS,
    SOURCE_NORMALISATION,
    Spec,
    arch_name,
    build_net,
)

FORMAT = "dyntta-checkpoint/1"
ZIP_MAGIC, PICKLE_MAGIC = b"PK\x03\x04", b"\x80"
"""How files written by ``torch.save`` start: a zip archive, or a legacy pickle (protocol 2+)."""

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
"""torchvision's ImageNet models and pytorch_resnet_cifar10 (Idelbayev, 2018) normalise inputs
with these statistics; they are the default for bare state dicts of torchvision ResNets and of
option-A CIFAR ResNets."""

TTAB_STATISTICS = {
    10: ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    100: ((0.5070751592371323, 0.48654887331495095, 0.4409178433670343),
          (0.2673342858792401, 0.2564384629170883, 0.27615047132568404)),
}
"""Classes -> (mean, std) TTAB trains its CIFAR-10 / CIFAR-100 models with
(LINs-lab/ttab ``ttab/configs/datasets.py``); the default for bare TTAB-layout state dicts."""

TORCHVISION_NAMES = ((r"^fc\.", "linear."), (r"\.downsample\.0\.", ".downsample.conv."),
                     (r"\.downsample\.1\.", ".downsample.bn."))
"""(torchvision pattern, dyntta name) for the parameter names that differ between the layouts."""

TTAB_NAMES = ((r"^classifier\.", "linear."),)
"""(TTAB ``ResNetCifar`` pattern, dyntta name): only the classifier's name differs."""


def tensors_fingerprint(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 (16 hex digits) of (name, tensor) pairs: every name, dtype, shape and value."""
    digest = hashlib.sha256()
    for name, tensor in named:
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def weights_fingerprint(model: nn.Module) -> str:
    """:func:`tensors_fingerprint` of ``model``'s state dict."""
    return tensors_fingerprint(model.state_dict().items())


def strip_prefix(state: dict[str, torch.Tensor], prefix: str = "module.") -> dict:
    """Drop ``prefix`` from every key that has it (``nn.DataParallel`` checkpoints)."""
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


def strip_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop ``module.`` where present, then ``model.`` if every key has it (RobustBench's
    loader removes both)."""
    state = strip_prefix(state)
    return strip_prefix(state, "model.") if all(k.startswith("model.") for k in state) else state


def is_torchvision_layout(state: dict[str, torch.Tensor]) -> bool:
    """Whether ``state`` names its parameters as torchvision's ResNets do (classifier ``fc``)."""
    return "fc.weight" in state and "linear.weight" not in state and "conv1.weight" in state \
        and not is_wide_resnet_layout(state)


def is_ttab_layout(state: dict[str, torch.Tensor]) -> bool:
    """Whether ``state`` names its parameters as TTAB's ``ResNetCifar`` does (``classifier``)."""
    return "classifier.weight" in state and "layer1.0.conv1.weight" in state


def rename(state: dict[str, torch.Tensor], names: Sequence[tuple[str, str]]) -> dict:
    """``state`` with every (pattern, replacement) of ``names`` applied to every key."""
    renamed = {}
    for key, value in state.items():
        for pattern, ours in names:
            key = re.sub(pattern, ours, key)
        renamed[key] = value
    return renamed


def from_torchvision_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename torchvision ResNet parameters (``fc``, ``downsample.0/1``) to dyntta's."""
    return rename(state, TORCHVISION_NAMES)


def infer_spec(state: dict[str, torch.Tensor]) -> Spec:
    """The spec (:class:`ResNetSpec`, :class:`WideResNetSpec`, :class:`ResNeXtSpec` or
    :class:`~dyntta.models.mlperf_resnet.MLPerfResNetSpec`) whose
    parameters have the names and shapes of ``state`` (in dyntta's names for ResNets)."""
    if is_wide_resnet_layout(state):
        return infer_wide_resnet_spec(state)
    if is_resnext_layout(state):
        return infer_resnext_spec(state)
    if is_mlperf_resnet_layout(state):
        return infer_mlperf_resnet_spec(state)
    if "conv1.weight" not in state or "linear.weight" not in state:
        raise ValueError(
            "cannot infer the architecture: expected keys 'conv1.weight' and 'linear.weight' "
            "(a ResNet of dyntta.models), 'block1.layer.0.conv1.weight' and 'fc.weight' (a "
            "RobustBench Wide ResNet), 'conv_1_3x3.weight' (an AugMix ResNeXt) or 'conv.weight', "
            "'stage1.conv1.weight' and 'fc.weight' (the MLPerf-Tiny ResNet-8); first keys "
            f"found: {sorted(state)[:6]}"
        )
    blocks: dict[int, set[int]] = {}
    for key in state:
        m = re.match(r"layer(\d+)\.(\d+)\.", key)
        if m:
            blocks.setdefault(int(m[1]), set()).add(int(m[2]))
    stages = sorted(blocks)
    if not stages or stages != list(range(1, len(stages) + 1)):
        raise ValueError(f"cannot infer the architecture: residual stages found {stages}")
    for s in stages:
        if blocks[s] != set(range(len(blocks[s]))) or f"layer{s}.0.conv1.weight" not in state:
            raise ValueError(f"cannot infer the architecture: stage layer{s} has blocks "
                             f"{sorted(blocks[s])}, expected 0..n-1 each with conv1.weight")
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


def check_values(state: dict[str, torch.Tensor], source: str) -> None:
    """Raise ``ValueError`` naming the first tensor with NaN/Inf values, or a BN ``running_var``
    with a negative entry (such a model predicts NaN or garbage after adaptation)."""
    for key, value in state.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise ValueError(f"{source}: tensor {key!r} holds {bad} NaN/Inf value(s) of "
                             f"{value.numel()}; the checkpoint is damaged")
        if key.endswith("running_var") and bool((value < 0).any()):
            raise ValueError(f"{source}: tensor {key!r} holds a negative variance "
                             f"({float(value.min()):g}); the checkpoint is damaged")


def read_failure(path: Path, exc: Exception) -> str:
    """Why ``torch.load`` could not read ``path``, in words (its own messages can be empty,
    a bare number or many lines)."""
    message = str(exc)
    unsafe = re.search(r"Unsupported global: GLOBAL ([\w.]+)", message)
    if path.stat().st_size == 0:
        return "the file is empty"
    if unsafe:
        return (f"it pickles a Python object ({unsafe[1]}), e.g. a whole model; save "
                "model.state_dict() or use dyntta.models.save_checkpoint")
    if isinstance(exc, EOFError):
        return "the file ends early (truncated?)"
    with open(path, "rb") as f:
        head = f.read(4)
    if not head.startswith((ZIP_MAGIC, PICKLE_MAGIC)):
        return "not a file written by torch.save (neither a zip archive nor a pickle)"
    first = message.strip().splitlines()[0].split(". ")[0] if message.strip() else ""
    return f"damaged or truncated torch file ({type(exc).__name__}{': ' + first if first else ''})"


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


def to_dyntta_names(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], str]:
    """``state`` in the names of dyntta's networks and the layout it came in: ``torchvision``,
    ``ttab`` (both translated) or ``dyntta`` (dyntta's ResNets, RobustBench's Wide ResNets and
    AugMix's ResNeXt, whose names dyntta keeps)."""
    if is_torchvision_layout(state):
        return from_torchvision_names(state), "torchvision"
    if is_ttab_layout(state):
        return rename(state, TTAB_NAMES), "ttab"
    return state, "dyntta"


def default_normalisation(
    spec: Spec, layout: str, num_classes: int, path: str | os.PathLike
) -> tuple[Sequence[float], Sequence[float]]:
    """(mean, std) a bare state dict was trained with, where its source is known: ImageNet
    statistics for torchvision ResNets and option-A CIFAR ResNets (pytorch_resnet_cifar10),
    TTAB's CIFAR-10 / CIFAR-100 statistics for TTAB ResNets of 10 / 100 classes, and
    ``SOURCE_NORMALISATION`` for the named RobustBench / AugMix architectures. Otherwise a
    ``ValueError`` asks for them."""
    name = arch_name(spec)
    if layout == "torchvision" or (isinstance(spec, ResNetSpec) and spec.shortcut == "A"):
        return IMAGENET_MEAN, IMAGENET_STD
    if layout == "ttab" and num_classes in TTAB_STATISTICS:
        return TTAB_STATISTICS[num_classes]
    if layout == "dyntta" and name in SOURCE_NORMALISATION:
        return SOURCE_NORMALISATION[name]
    raise ValueError(
        f"{path} carries no input normalisation; pass mean=... and std=... "
        "(per-channel statistics of the training images in [0, 1])"
    )


def read_state_dict(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The dict ``torch.load`` reads from ``path`` and the state dict in it (unwrapped from
    ``{"state_dict": ...}`` or ``{"model": ...}``, ``module.`` / ``model.`` prefixes stripped,
    values checked by :func:`check_values`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        blob: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling errors come in many types
        raise ValueError(f"{path} is not a readable torch checkpoint: "
                         f"{read_failure(path, exc)}") from exc
    if not isinstance(blob, dict):
        raise ValueError(f"{path}: expected a dict (state dict or checkpoint), got {type(blob)}")
    state = blob.get("state_dict", blob.get("model", blob))
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: no state dict of tensors found")
    odd = next((k for k in state if not isinstance(k, str)), None)
    if odd is not None:
        raise ValueError(f"{path}: state dict keys must be parameter names, got {odd!r}")
    check_values(state, str(path))
    return blob, strip_prefixes(state)


def load_checkpoint(
    path: str | os.PathLike,
    arch: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> Normalized:
    """Load a classifier for images in [0, 1], ready for :func:`dyntta.adapt`.

    Args:
        path: a dyntta checkpoint or a state dict (possibly wrapped as ``{"state_dict": ...}`` or
            ``{"model": ...}``).
        arch: a name from ``ARCHITECTURES`` to insist on; inferred from the state dict if None.
        mean, std: input normalisation; overrides the checkpoint's. Required for a bare state
            dict unless its source is known (:func:`default_normalisation`).

    Returns:
        A :class:`Normalized` model in eval mode.
    """
    path = Path(path)
    blob, state = read_state_dict(path)
    own_format = blob.get("format") == FORMAT
    if (mean is None) != (std is None):
        raise ValueError(f"give both mean and std (the input normalisation), not only "
                         f"{'mean' if std is None else 'std'}")
    if own_format and (mean is None) and not {"mean", "std"} <= set(blob):
        raise ValueError(f"{path}: a dyntta checkpoint without its input normalisation ('mean' "
                         "and 'std'); pass mean=... and std=...")
    state, layout = to_dyntta_names(state)
    if arch is None:
        try:
            spec = infer_spec(state)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    elif arch in ARCHITECTURES:
        spec = ARCHITECTURES[arch]
    else:
        raise ValueError(f"unknown architecture {arch!r}; available: {', '.join(ARCHITECTURES)}")
    head = f"{NETWORKS[type(spec)].head}.weight"
    if head not in state:
        raise ValueError(f"{path}: no classifier weights {head!r} in the state dict")
    net = build_net(spec, num_classes=state[head].shape[0])
    load_state_checked(net, state, str(path))
    if mean is None or std is None:
        if own_format:
            mean, std = blob["mean"], blob["std"]
        else:
            mean, std = default_normalisation(spec, layout, state[head].shape[0], path)
    try:
        model = Normalized(net, mean, std)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    model.classes = list(blob.get("classes") or []) if own_format else []
    return model.eval()


def save_checkpoint(
    model: Normalized, path: str | os.PathLike, classes: Sequence[str] | None = None
) -> None:
    """Write ``model`` with its architecture, classes and normalisation, atomically."""
    if not isinstance(model, Normalized) or type(model.net) not in NETWORKS.values():
        raise ValueError(
            "save_checkpoint expects Normalized(net) with a net from dyntta.models "
            f"({', '.join(cls.__name__ for cls in NETWORKS.values())})"
        )
    blob = {
        "format": FORMAT,
        "arch": arch_name(model.net.spec),
        "mean": model.mean.flatten().tolist(),
        "std": model.std.flatten().tolist(),
        "classes": list(classes or []),
        "state_dict": model.net.state_dict(),
    }
    save_atomic(blob, path)


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)``, atomically and byte for byte the same for the same ``obj``:
    through a buffer, so the archive inside is named ``archive``, not after the temporary file
    (whose random name would change the file's sha256, and with it the records' provenance)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_atomic(path, buffer.getvalue())
