"""What ``dyn_adaptive`` reads of its source model on clean images of the model's own domain
(its reference): the first stage's between/within ratios, which its groups of one domain are
tested against (:func:`~dyntta.norm.adaptive.offset_channels`)."""

from __future__ import annotations

import torch
from torch import nn

from dyntta.methods.base import check_values
from dyntta.models.checkpoint import tensors_fingerprint, weights_fingerprint
from dyntta.norm.adaptive import between_within, between_within_ratio
from dyntta.norm.spectrum import MIN_IMAGES
from dyntta.norm.stats import instance_stats

REMEMBERED = 8
"""Readings :func:`reference_ratios` keeps (a bench adapts one model on one reference in every
cell)."""

_READINGS: dict[tuple[str, str, int], dict[str, torch.Tensor]] = {}


@torch.no_grad()
def source_ratios(model: nn.Module, images: torch.Tensor, group: int = MIN_IMAGES
                  ) -> dict[str, torch.Tensor]:
    """What :func:`~dyntta.norm.adaptive.offset_channels` tests ``dyn_adaptive``'s groups of
    one domain against, read on clean images: per BN layer of ``model``'s first stage (those
    whose maps are the largest, where ``dyn_adaptive`` applies the instance rule), the (C,)
    ratio of the variance of the instance means between the images of a group to the mean
    instance variance within them (:func:`~dyntta.norm.adaptive.between_within`), each summed
    over the groups of ``group`` images before the division, the model normalising with its
    own BN statistics. A BN module run several times per forward sums over its calls.

    Args:
        model: a classifier of images (B, C, H, W) in [0, 1]; not modified.
        images: (n, C, H, W) in [0, 1] of the model's own domain, n >= ``group``; the last
            ``n % group`` are left out.
        group: images per group, as many as ``dyn_adaptive`` joins into a group of one domain.

    Returns:
        The ratios by the BN modules' names in ``model``.
    """
    if images.ndim != 4 or len(images) < group or not images.is_floating_point():
        raise ValueError(f"reference images must be float (n, C, H, W) in [0, 1] with n >= "
                         f"{group} (one group), got {images.dtype} of shape "
                         f"{tuple(images.shape)}")
    try:
        check_values(images)
    except ValueError as error:
        raise ValueError(f"reference images: {error}") from None
    names = {m: name for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    sums: dict[str, list[torch.Tensor]] = {}
    sizes: dict[str, int] = {}

    def record(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        x = inputs[0]
        between, within = between_within(*instance_stats(x))
        name = names[module]
        sizes[name] = x.shape[2] * x.shape[3]
        sums[name] = [between, within] if name not in sums else \
            [sums[name][0] + between, sums[name][1] + within]

    was_training = model.training
    hooks = [m.register_forward_pre_hook(record) for m in names]
    try:
        model.eval()
        for start in range(0, len(images) - group + 1, group):
            model(images[start : start + group])
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    largest = max(sizes.values())
    return {name: between_within_ratio(between, within)
            for name, (between, within) in sums.items() if sizes[name] == largest}


def reference_ratios(model: nn.Module, images: torch.Tensor, group: int = MIN_IMAGES
                     ) -> dict[str, torch.Tensor]:
    """:func:`source_ratios`, read once per content: the last :data:`REMEMBERED` readings are
    kept by the fingerprints of the model's state dict and of the images (equal contents give
    the same reading; any change of a weight or a pixel reads anew)."""
    key = (weights_fingerprint(model), tensors_fingerprint([("images", images)]), group)
    if key not in _READINGS:
        if len(_READINGS) >= REMEMBERED:
            del _READINGS[next(iter(_READINGS))]
        _READINGS[key] = source_ratios(model, images, group)
    return {name: ratio.clone() for name, ratio in _READINGS[key].items()}
