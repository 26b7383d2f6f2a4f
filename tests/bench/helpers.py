"""A tiny in-memory source for benchmark tests: 3 corruptions of 40 random images."""

from __future__ import annotations

import numpy as np

from dyntta.bench.sources import Source
from dyntta.data import ArrayCorruptedDataset
from tests.conftest import tiny_resnet

CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise")


def tiny_source(entry=None, options=None, progress=False) -> Source:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=40)
    arrays = {
        (c, 5): np.clip(rng.normal(60 * (i + 1), 30, size=(40, 8, 8, 3)), 0, 255).astype(np.uint8)
        for i, c in enumerate(CORRUPTIONS)
    }
    return Source("tiny", ArrayCorruptedDataset(arrays, labels, "tiny"), tiny_resnet(), "tiny",
                  checkpoint_sha256="tiny-model")


GRID_TOML = """
title = "tiny grid"
seeds = [0, 1]
methods = ["source", "tbn", "dyn"]
[stream]
scenarios = ["crossmix", "continual"]
batch_sizes = [16]
n_domains = [3]
[[datasets]]
name = "digits"
"""
