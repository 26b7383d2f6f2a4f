"""How far a model trusts its source statistics, read from its own predictions (beyond the DYN
paper; `dyn_adaptive`'s).

With exact domain statistics, the source weight that serves a model best differs from model to
model by up to two thirds, and no statistic of the features measured tells them apart
(RESULTS.md, "What exact domain statistics say"). What differs is the network's response, so
it is measured there: test images already predicted are cut into batches of :data:`BATCH`, a
random fifth of each batch shifted by each of :data:`SYNTHETIC` (no shift among them), and DYN's
layer, the synthetic domains as its clusters, predicts the shifted batch at each candidate
source weight. The weight whose predictions agree most often with its own on the batch as it
came (one cluster) is the one that undoes the shifts best for this model: no label is read.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from dyntta.norm import ClusterAwareBatchNorm2d, replace_batchnorm
from dyntta.state import CarriesState

SYNTHETIC = ("none", "noise", "blur", "contrast", "brightness")
BATCH = 64
"""Images per synthetic batch: about 13 per synthetic domain."""
DRAWS = 4
"""Synthetic shifts drawn for each synthetic batch."""


def synthetic_shift(x: torch.Tensor, kind: torch.Tensor, generator: torch.Generator
                    ) -> torch.Tensor:
    """Each image ``x[i]`` ((B, 3, H, W) in [0, 1]) under ``SYNTHETIC[kind[i]]``: unchanged,
    Gaussian noise of std 0.1, a 3x3 box blur (edges replicated), contrast 0.4 about the image's
    mean, brightness + 0.3; clipped to [0, 1]."""
    mean = x.mean((1, 2, 3), keepdim=True)
    noise = torch.randn(x.shape, generator=generator).to(x.device)
    shifted = torch.stack([
        x,
        x + 0.1 * noise,
        F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, 1),
        (x - mean) * 0.4 + mean,
        x + 0.3,
    ])
    return shifted[kind, torch.arange(len(x), device=x.device)].clamp(0, 1)


class GivenClusters:
    """A clustering for :class:`ClusterAwareBatchNorm2d` that returns the labels last shown."""

    def show(self, labels: torch.Tensor) -> None:
        self.labels = labels

    def __call__(self, mu: torch.Tensor) -> torch.Tensor:
        return self.labels


def given_cluster_model(model: nn.Module, clusters: GivenClusters, alpha: float) -> nn.Module:
    """A copy of ``model`` whose BN layers are DYN's at source weight ``alpha``, clustering by
    the labels ``clusters`` shows."""
    model = copy.deepcopy(model)
    replace_batchnorm(model, lambda bn: ClusterAwareBatchNorm2d(bn, alpha, clustering=clusters))
    return model.eval().requires_grad_(False)


class SourceTrust(CarriesState):
    """Chooses one of ``levels`` (fractions of the source weight ``reference``) from the
    agreement of DYN's layer at ``level * reference`` on synthetic batches of the first
    ``images`` images it observes: the level of most agreement so far, the highest of those
    tied, and the highest before a synthetic batch is complete. Its reading (agreements, images
    read, those waiting for a full batch, the generator) is adaptation state; :meth:`reset`
    restarts it.

    Args:
        model: the source model (copied, never changed).
        reference: the source weight of level 1, in [0, 1].
        levels: the fractions, in [0, 1].
        images: how many images to read (whole synthetic batches of :data:`BATCH`).
        seed: the synthetic shifts' generator seed.
    """

    adaptation_state = ("agreement", "read", "waiting", "generator")

    def __init__(self, model: nn.Module, reference: float, levels: tuple[float, ...],
                 images: int, seed: int = 0) -> None:
        super().__init__()
        self.reference = reference
        self.levels = levels
        self.images = images - images % BATCH
        self.seed = seed
        self.clusters = GivenClusters()
        self.model = given_cluster_model(model, self.clusters, reference)
        self.reset()

    def reset(self) -> None:
        self.agreement = torch.zeros(len(self.levels), dtype=torch.float64)
        self.read = 0
        self.waiting: torch.Tensor | None = None
        self.generator = torch.Generator().manual_seed(self.seed)

    @property
    def level(self) -> float:
        """The level chosen so far: the highest among those of most agreement."""
        best = self.agreement.max()
        return max(level for level, a in zip(self.levels, self.agreement.tolist()) if a == best)

    def observe(self, x: torch.Tensor) -> None:
        """Read the images ``x`` (B, 3, H, W) in [0, 1], until ``images`` are read."""
        if self.read >= self.images:
            return
        x = x.detach() if self.waiting is None else torch.cat([self.waiting, x.detach()])
        while len(x) >= BATCH and self.read < self.images:
            self.agreement += self.agreements(x[:BATCH])
            self.read += BATCH
            x = x[BATCH:]
        self.waiting = x if len(x) and self.read < self.images else None

    def agreements(self, x: torch.Tensor) -> torch.Tensor:
        """(len(levels),) how often the layer at each level predicts an image of ``x`` alike
        with and without a synthetic shift (one cluster per kind), a random fifth of the images
        per kind, over :data:`DRAWS` draws."""
        kinds = [torch.randperm(len(x), generator=self.generator).to(x.device) % len(SYNTHETIC)
                 for _ in range(DRAWS)]
        shifted = [synthetic_shift(x, kind, self.generator) for kind in kinds]
        layers = [m for m in self.model.modules() if isinstance(m, ClusterAwareBatchNorm2d)]
        alike = []
        with torch.no_grad():
            for level in self.levels:
                for layer in layers:
                    layer.alpha = level * self.reference
                self.clusters.show(torch.zeros_like(kinds[0]))
                reference = self.model(x).argmax(1)
                for kind, images in zip(kinds, shifted):
                    self.clusters.show(kind)
                    alike.append(self.model(images).argmax(1) == reference)
        return torch.stack(alike).reshape(len(self.levels), -1).sum(1).to(torch.float64).cpu()
