"""How far ``dyn_adaptive`` should trust a model's source statistics, read from the model on
clean images (beyond the DYN paper).

The share of the source that serves a group of test samples best is the model's, not the
data's: with the true domains as clusters the CIFAR-10 ResNet-20 wants a third to two thirds of
it, the MLPerf-Tiny ResNet-8 none (docs/dyn-adaptive-rules.md, "What exact domain statistics
say"), and no reading of the test features tells the models apart. The model's response to
shifts it can be shown tells it: :func:`calibrate_source_weights` runs ``dyn_adaptive`` on the
clean images under five synthetic shifts (simple ones of fixed strength, not the benchmark's
corruptions, though four of their kinds are among its fifteen), mixed within every batch, at
each candidate value of the two options that weight the source: ``prior_strength`` N (the
neighbourhood layers) and then ``balanced_alpha`` (the deep layers), and counts how often it
predicts what the model predicts on the clean images. Each keeps its default unless another
candidate does better beyond the paired 95% interval.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F

from dyntta.methods.dyn_adaptive import DYNAdaptiveConfig
from dyntta.methods.registry import adapt

SHIFTS = ("noise", "blur", "contrast", "brightness", "pixelate")
"""The synthetic shifts, each on an equal share of the images (:func:`synthetic_shift`)."""
CANDIDATES = {"prior_strength": (1.0, 4.0, 16.0, 64.0), "balanced_alpha": (0.0, 0.2, 0.4, 0.6)}
"""The values compared, read in this order: N at the default 16 and factors of 4 either side,
then the deep source weight at the default 0.4, none, and steps of 0.2 either side."""
Z95 = 1.959964
"""The standard normal's 97.5% quantile: a two-sided 95% interval."""


def synthetic_shift(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """Images ``x`` ((B, C, H, W) in [0, 1]) under one of :data:`SHIFTS`: Gaussian noise of
    std 0.2, a 5x5 box blur (edges replicated), contrast 0.3 about each image's mean, brightness
    + 0.4, or pixelation (area-averaged to a quarter of the side, then enlarged by repetition);
    clipped to [0, 1]."""
    if kind == "noise":
        shifted = x + 0.2 * torch.randn(x.shape, generator=generator).to(x.device)
    elif kind == "blur":
        shifted = F.avg_pool2d(F.pad(x, (2, 2, 2, 2), mode="replicate"), 5, 1)
    elif kind == "contrast":
        centre = x.mean((1, 2, 3), keepdim=True)
        shifted = (x - centre) * 0.3 + centre
    elif kind == "brightness":
        shifted = x + 0.4
    elif kind == "pixelate":
        small = F.interpolate(x, size=(max(1, x.shape[2] // 4), max(1, x.shape[3] // 4)),
                              mode="area")
        shifted = F.interpolate(small, size=x.shape[2:], mode="nearest")
    else:
        raise ValueError(f"unknown shift {kind!r}; one of {', '.join(SHIFTS)}")
    return shifted.clamp(0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Reading:
    """What the calibration read for one option.

    chosen: the value chosen.
    agreement: for each candidate value, the share of the shifted images on which
        ``dyn_adaptive`` predicted the reference class.
    interval: for each candidate value, the paired 95% interval of its agreement minus the
        default's (normal, over the images).
    images: how many images were read.
    """

    chosen: float
    agreement: dict[float, float]
    interval: dict[float, tuple[float, float]]
    images: int


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate_source_weights` read: a :class:`Reading` per option, in the order
    read; :attr:`options` are the values chosen, for ``adapt(model, "dyn_adaptive",
    **calibration.options)``."""

    readings: dict[str, Reading]

    @property
    def options(self) -> dict[str, float]:
        return {name: reading.chosen for name, reading in self.readings.items()}


@torch.no_grad()
def calibrate_source_weights(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    candidates: Mapping[str, tuple[float, ...]] = CANDIDATES,
    batch_size: int = 64,
    seed: int = 0,
) -> Calibration:
    """``dyn_adaptive``'s source weights for ``model``, read on clean images.

    The images are shuffled (``seed``), split into equal shares, one per synthetic shift
    (:func:`synthetic_shift`), and shuffled together into one stream of batches of
    ``batch_size``, every batch a mixture of shifts. A fresh ``dyn_adaptive`` runs the stream at
    each candidate value of each option in turn, the options read before at their chosen values
    and the others at their defaults; its agreement is the share of images on which it predicts
    the reference: ``labels`` where given, else the model's own prediction on the clean image
    normalised by the statistics of its clean batch (TBN; a model whose source statistics are
    stale still predicts well that way). The value of highest agreement is chosen where the
    lower end of its paired 95% interval against the default lies above 0 (:func:`choose`);
    otherwise the default.

    Args:
        model: a classifier of images (B, C, H, W) in [0, 1]; not modified.
        images: (n, C, H, W) in [0, 1] of the model's own domain (e.g. validation images), at
            least one per shift. The more, the narrower the intervals: on the CIFAR-10 models of
            docs/dyn-adaptive-rules.md differences of 1 to 2 points decide, which 10,000 images
            resolve and 2,000 not always.
        labels: (n,) classes, or None (the model's TBN predictions are the reference).
        candidates: the values compared for each option (fields of
            :class:`~dyntta.methods.dyn_adaptive.DYNAdaptiveConfig`), read in this order; each
            option's default is always among them.
    """
    fields = {f.name for f in dataclasses.fields(DYNAdaptiveConfig)}
    unknown = sorted(set(candidates) - fields)
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; fields of DYNAdaptiveConfig")
    if images.ndim != 4 or len(images) < len(SHIFTS):
        raise ValueError(f"images must be (n, C, H, W) with n >= {len(SHIFTS)} (one per shift), "
                         f"got shape {tuple(images.shape)}")
    if labels is not None and labels.shape != images.shape[:1]:
        raise ValueError(f"labels must be ({len(images)},), one per image, got shape "
                         f"{tuple(labels.shape)}")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(images), generator=generator).to(images.device)
    images = images[order]
    if labels is None:  # the clean batches of the shuffled images, normalised by their own
        tbn = adapt(model, "tbn")
        labels = torch.cat([tbn(x).argmax(1) for x in images.split(batch_size)])
    else:
        labels = labels.to(images.device)[order]
    shifted = torch.cat([synthetic_shift(share, kind, generator) for kind, share in
                         zip(SHIFTS, images.tensor_split(len(SHIFTS)))])
    mixed = torch.randperm(len(images), generator=generator).to(images.device)
    shifted, labels = shifted[mixed], labels[mixed]
    runs: dict[tuple, torch.Tensor] = {}  # hits by the options off their defaults: one run each

    def hits(options: dict[str, float]) -> torch.Tensor:
        key = tuple(sorted((name, value) for name, value in options.items()
                           if value != getattr(DYNAdaptiveConfig, name)))
        if key not in runs:
            adapted = adapt(model, "dyn_adaptive", **options)
            predicted = torch.cat([adapted(x).argmax(1) for x in shifted.split(batch_size)])
            runs[key] = (predicted == labels).double().cpu()
        return runs[key]

    chosen: dict[str, float] = {}
    readings = {}
    for name, values in candidates.items():
        default = getattr(DYNAdaptiveConfig, name)
        readings[name] = choose({v: hits({**chosen, name: v})
                                 for v in sorted({*values, default})}, default)
        chosen[name] = readings[name].chosen
    return Calibration(readings)


TABLE_HEADER = ("| model | images | option | agreement in % at each value (95% interval against "
                "the default) | chosen |\n|---|---|---|---|---|")
"""The header of :func:`table_rows`."""


def table_rows(calibration: Calibration, model: str) -> list[str]:
    """Markdown rows under :data:`TABLE_HEADER`: for each option read, the agreement at each
    value with its interval against the default (in points), and the value chosen."""
    out = []
    for name, reading in calibration.readings.items():
        cells = []
        for value, agreement in reading.agreement.items():
            low, high = reading.interval[value]
            versus = "" if value == getattr(DYNAdaptiveConfig, name) \
                else f" ({100 * low:+.1f}, {100 * high:+.1f})"
            cells.append(f"{value:g}: {100 * agreement:.1f}{versus}")
        out.append(f"| {model} | {reading.images} | `{name}` | " + "; ".join(cells)
                   + f" | {reading.chosen:g} |")
    return out


def choose(hits: dict[float, torch.Tensor], default: float) -> Reading:
    """The :class:`Reading` of per-image ``hits`` (1 where the candidate value led to the
    reference, else 0; (n,) for each value, ``default`` among them): the value of highest
    agreement where the lower end of its paired 95% interval against ``default`` (normal, the
    mean difference plus or minus 1.96 standard errors over the images) lies above 0; otherwise
    ``default``."""
    agreement = {v: float(h.mean()) for v, h in hits.items()}
    interval = {}
    for v, h in hits.items():
        difference = h - hits[default]
        mean = float(difference.mean())
        half = Z95 * float(difference.std()) / len(difference) ** 0.5 \
            if len(difference) > 1 else float("inf")
        interval[v] = (mean - half, mean + half)
    best = max(agreement, key=agreement.get)
    chosen = best if interval[best][0] > 0 else default
    return Reading(chosen, agreement, interval, len(hits[default]))
