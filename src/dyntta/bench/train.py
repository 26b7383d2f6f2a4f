"""Train a source classifier deterministically from a seed (the benchmark's embedded default)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from tqdm.auto import tqdm

from dyntta.data.datasets import check_labels, to_tensor
from dyntta.models import Normalized, ResNet, ResNetSpec
from dyntta.models.resnet import ARCHITECTURES


def channel_stats(images: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of uint8 images (N, H, W, C), in [0, 1] units."""
    x = images.reshape(-1, images.shape[-1]).astype(np.float64) / 255.0
    return x.mean(0).tolist(), np.maximum(x.std(0), 1e-3).tolist()


def random_crop(x: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """Pad by ``pad`` (reflect) and crop back at one random offset per batch."""
    if pad == 0:
        return x
    h, w = x.shape[2:]
    padded = F.pad(x, (pad,) * 4, mode="reflect")
    i, j = torch.randint(0, 2 * pad + 1, (2,), generator=generator).tolist()
    return padded[:, :, i : i + h, j : j + w]


def train_classifier(
    images: np.ndarray,
    labels: np.ndarray,
    arch: str | ResNetSpec | nn.Module = "resnet20",
    epochs: int = 15,
    batch_size: int = 64,
    lr: float = 0.1,
    weight_decay: float = 5e-4,
    crop_pad: int = 2,
    seed: int = 0,
    progress: bool = True,
) -> Normalized:
    """Train a ResNet (``arch``: a name or spec) or a network of your own (``arch``: an
    ``nn.Module`` mapping normalised images to logits, trained in place) on uint8 images
    (N, H, W, 3) and int labels (N,) with SGD + cosine decay.

    The same arguments give the same weights on the same CPU and thread count (seeded
    initialisation, shuffling and crops; a module of your own brings its own initialisation);
    another thread count can sum in another order, and the weights drift apart.

    Returns:
        A :class:`Normalized` model in eval mode whose normalisation is the training images'.
    """
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 (N, H, W, 3), got {images.dtype} {images.shape}")
    check_labels(labels, "training labels")
    if len(labels) != len(images):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    if epochs < 1 or batch_size < 2 or not lr > 0:
        raise ValueError(f"training needs epochs >= 1, batch_size >= 2 (BN) and lr > 0; got "
                         f"epochs={epochs}, batch_size={batch_size}, lr={lr}")
    num_classes = int(labels.max()) + 1
    absent = num_classes - len(np.unique(labels))
    if absent:
        raise ValueError(f"training labels go up to {num_classes - 1} but {absent} of the classes "
                         f"0..{num_classes - 1} have no example (a stray label?): labels must be "
                         "0..K-1 with every class present")
    torch.manual_seed(seed)
    if isinstance(arch, nn.Module):
        net = arch
    else:
        spec = ARCHITECTURES.get(arch) if isinstance(arch, str) else arch
        if spec is None:
            raise ValueError(f"unknown architecture {arch!r}; available: "
                             f"{', '.join(ARCHITECTURES)}")
        net = ResNet(spec, num_classes)
    mean, std = channel_stats(images)
    model = Normalized(net, mean, std)
    x_all, y_all = to_tensor(images), torch.as_tensor(labels, dtype=torch.long)
    steps_per_epoch = math.ceil(len(x_all) / batch_size)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay, nesterov=True
    )
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * steps_per_epoch)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in tqdm(range(epochs), desc="train source model", disable=not progress, leave=False):
        order = torch.randperm(len(x_all), generator=generator)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            if len(idx) < 2:
                continue  # BN needs two samples; this one returns next epoch
            x = random_crop(x_all[idx], crop_pad, generator)
            loss = F.cross_entropy(model(x), y_all[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    return model.eval()

