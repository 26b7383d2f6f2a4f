"""The embedded default data set: scikit-learn's digits, as 32x32 RGB, and its corrupted test set.

No download: ``sklearn.datasets.load_digits`` ships 1,797 8x8 images (values 0..16) of 10 classes.
They are scaled to 0..255, upsampled to 32x32 (Pillow bilinear) and repeated over 3 channels, so
the CIFAR-10-C recipe applies unchanged. The split is fixed: every fourth sample (index % 4 == 3)
is a test sample (449 of them), the rest train (1,348).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from dyntta.data.build import build_corrupted
from dyntta.data.corruptions import CORRUPTIONS
from dyntta.data.datasets import SEVERITIES, NpyCorruptedDataset

SIZE = 32
TEST_EVERY = 4


def default_cache_dir() -> Path:
    """``$DYNTTA_CACHE`` if set, else ``~/.cache/dyntta``."""
    return Path(os.environ.get("DYNTTA_CACHE") or Path.home() / ".cache" / "dyntta").expanduser()


def digits_rgb() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits as (N, 32, 32, 3) uint8 images and (N,) int64 labels."""
    from sklearn.datasets import load_digits  # imported on use: slow to import

    digits = load_digits()
    small = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    large = np.stack([
        np.asarray(Image.fromarray(image).resize((SIZE, SIZE), Image.BILINEAR)) for image in small
    ])
    return np.repeat(large[..., None], 3, axis=-1), digits.target.astype(np.int64)


def load_digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed split ``(train_x, train_y, test_x, test_y)``: images (N, 32, 32, 3) uint8,
    labels (N,) int64; test = every fourth sample (449), train = the others (1,348)."""
    images, labels = digits_rgb()
    test = np.arange(len(labels)) % TEST_EVERY == TEST_EVERY - 1
    return images[~test], labels[~test], images[test], labels[test]


def load_digits_c(
    cache_dir: str | os.PathLike | None = None,
    corruptions: Sequence[str] = CORRUPTIONS,
    severities: Sequence[int] = SEVERITIES,
    seed: int = 0,
    progress: bool = False,
) -> NpyCorruptedDataset:
    """The digits test split corrupted with the CIFAR-10-C recipe, built once into
    ``<cache_dir>/digits-c-s<severities>-seed<seed>`` (default :func:`default_cache_dir`) and
    reused afterwards (corruptions missing from the cache are added)."""
    severities = sorted(set(severities))
    root = default_cache_dir() if cache_dir is None else Path(cache_dir)
    out = root / f"digits-c-s{''.join(map(str, severities))}-seed{seed}"
    _, _, test_x, test_y = load_digits_split()
    return build_corrupted(test_x, test_y, out, corruptions, severities, seed, progress)
