"""A model's BN statistics re-estimated on clean images of the data it is deployed on."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def refresh_statistics(model: nn.Module, images: torch.Tensor, batch_size: int = 100,
                       validate: bool = True) -> nn.Module:
    """``model`` (changed in place, returned in eval mode) with the running statistics of every
    BatchNorm2d replaced by the average of those of the batches of ``images``: the mean of the
    batches' means and of their unbiased variances, as ``nn.BatchNorm2d`` with
    ``momentum=None``. Only the BN layers run in training mode (dropout stays off). Nothing else
    changes.

    For a model whose source statistics do not describe even the uncorrupted images it is
    deployed on (trained on PNG images, deployed on JPEG ones, say: RESULTS.md, "The ResNet-8's
    source statistics do not describe its test images"), before adapting it: a hundred or more
    clean images of the deployment's own pipeline.

    Args:
        model: takes ``images`` as they are (e.g. a :class:`~dyntta.models.Normalized`).
        images: (N, C, H, W) floats, N >= 1, in [0, 1] as :func:`dyntta.adapt` takes them.
        batch_size: images per batch, >= 1 (the last batch may be smaller).
        validate: check that the values are finite and in [0, 1] (as ``dyntta.adapt``'s
            ``validate``: 0-255 images would give statistics of nothing the model meets).
    """
    from dyntta.methods.base import check_values

    if not isinstance(images, torch.Tensor):
        raise ValueError(f"refresh_statistics needs images as a torch.Tensor, got "
                         f"{type(images).__name__} (uint8 (N, H, W, 3) arrays: "
                         "torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255)")
    if images.ndim != 4 or not images.is_floating_point() or len(images) == 0:
        raise ValueError(f"refresh_statistics needs float images (N, C, H, W) with N >= 1, got "
                         f"{images.dtype} of shape {tuple(images.shape)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if validate:
        check_values(images)
    layers = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    if not layers:
        raise ValueError("refresh_statistics: the model has no BatchNorm2d layer")
    if any(m.running_mean is None for m in layers):
        raise ValueError("refresh_statistics: a BatchNorm2d layer keeps no running statistics "
                         "(track_running_stats=False)")
    momenta = [m.momentum for m in layers]
    model.eval()  # dropout and the like stay off; only the BN layers update
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches
        m.train()
    try:
        for start in range(0, len(images), batch_size):
            model(images[start : start + batch_size])
    finally:
        for m, momentum in zip(layers, momenta):
            m.momentum = momentum
        model.eval()
    return model


def statistics_hits(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                    batch_size: int = 100) -> tuple[list[int], list[int], list[int]]:
    """Whether ``model``'s BN statistics describe clean ``images``: per batch of ``batch_size``
    (in order), the correct predictions with the model's own statistics (the source model) and
    with each batch's own (TBN), and the batch's size. Where the source scores clearly below TBN,
    the statistics are stale for these images (:func:`refresh_statistics` them); the model is
    not changed.

    Args:
        images: as :func:`refresh_statistics` takes them; labels: (N,) class indices.
    """
    import dyntta

    if len(labels) != len(images):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    source, tbn = dyntta.adapt(model, "source"), dyntta.adapt(model, "tbn")
    hits: tuple[list[int], list[int], list[int]] = ([], [], [])
    for start in range(0, len(images), batch_size):
        x, y = images[start : start + batch_size], labels[start : start + batch_size]
        for method, counts in zip((source, tbn), hits):
            counts.append(int((method(x).argmax(1) == y).sum()))
        hits[2].append(len(y))
    return hits


def statistics_gap(hits: tuple[list[int], list[int], list[int]]
                   ) -> tuple[float, float, float, float]:
    """From :func:`statistics_hits`: the source's and TBN's accuracy (%) and the paired 95%
    interval (points) of their difference over the batches; the statistics are stale for
    these images where its upper end is below 0."""
    from dyntta.bench.stats import difference_interval

    source, tbn, counts = hits
    low, high = difference_interval(([source], [counts]), ([tbn], [counts]))
    return 100 * sum(source) / sum(counts), 100 * sum(tbn) / sum(counts), 100 * low, 100 * high
