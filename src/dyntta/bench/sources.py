"""Where a benchmark's test data and source model come from.

Dataset kinds (``DatasetEntry.name``):

- ``digits``: the embedded default. scikit-learn's digits (upsampled to 32x32 RGB, fixed split);
  a ResNet-20 is trained on its training part once (seeded, cached) and its test part is
  corrupted by the 15 CIFAR-10-C corruptions at the severities asked for (cached). Needs no
  download.
- ``cifar10-c`` / ``cifar100-c``: a published set in the CIFAR-10-C layout
  (``<path>/<corruption>.npy``, ``labels.npy``); ``path`` defaults to ``CIFAR-10-C`` /
  ``CIFAR-100-C`` under ``--data-dir``. Needs a checkpoint.
- ``imagenet-c``: ImageNet-C's folder layout (``<path>/<corruption>/<severity>/<wnid>/*.JPEG``).
  Needs a checkpoint.
- ``npz``: a clean test set in an ``.npz`` (``x`` uint8 (N, H, W, 3), ``y`` labels), corrupted
  here once (the severities asked for) and cached (e.g. ``../shared/data/cifar10-test-jpeg.npz``). Needs a checkpoint.

Relative paths are resolved against ``--data-dir``; caches live in ``--cache-dir`` (default
``$DYNTTA_CACHE`` or ``~/.cache/dyntta``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from torch import nn

from dyntta.bench.config import DatasetEntry
from dyntta.bench.train import train_classifier
from dyntta.data import (
    SEVERITIES,
    CorruptedDataset,
    build_corrupted,
    default_cache_dir,
    load_corrupted,
    load_digits_c,
    load_digits_split,
    load_npz,
)
from dyntta.models import load_checkpoint, save_checkpoint

DATASETS = ("digits", "cifar10-c", "cifar100-c", "imagenet-c", "npz")
DEFAULT_FOLDERS = {"cifar10-c": "CIFAR-10-C", "cifar100-c": "CIFAR-100-C", "imagenet-c": "ImageNet-C"}

DIGITS_TRAINING = {"arch": "resnet20", "epochs": 15, "seed": 0}
"""How the embedded default's source model is trained (part of its cache key)."""


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """Where files are: ``data_dir`` for relative paths, ``cache_dir`` for what is built here,
    ``checkpoint`` to override every dataset's model; ``severities`` that sets built here need."""

    data_dir: str | None = None
    cache_dir: str | None = None
    checkpoint: str | None = None
    severities: tuple[int, ...] = SEVERITIES


@dataclasses.dataclass
class Source:
    """A test set and the source model to adapt on it."""

    name: str
    dataset: CorruptedDataset
    model: nn.Module
    model_name: str


def cache_root(options: SourceOptions) -> Path:
    return Path(options.cache_dir) if options.cache_dir else default_cache_dir()


def resolve_path(path: str, options: SourceOptions, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute():
        if options.data_dir is None:
            raise ValueError(f"{what} {path!r} is relative: give --data-dir (the folder holding it)")
        p = Path(options.data_dir).expanduser() / p
    return p


def resolve_source(
    entry: DatasetEntry, options: SourceOptions = SourceOptions(), progress: bool = True
) -> Source:
    """Open the dataset of ``entry`` and load (or train, for ``digits``) its source model."""
    if entry.name not in DATASETS:
        raise ValueError(f"unknown dataset {entry.name!r}; valid: {', '.join(DATASETS)}")
    if entry.name == "digits":
        return digits_source(options, progress)
    checkpoint = options.checkpoint or entry.checkpoint
    if checkpoint is None:
        raise ValueError(f"dataset {entry.name!r} needs a model: give --checkpoint PATH")
    checkpoint_path = resolve_path(checkpoint, options, "checkpoint")
    model = load_checkpoint(checkpoint_path)
    if entry.name == "npz":
        if entry.path is None:
            raise ValueError("dataset 'npz' needs path = the .npz file of clean test images")
        dataset = corrupted_npz(resolve_path(entry.path, options, "dataset"), options, progress)
    else:
        folder = resolve_path(entry.path or DEFAULT_FOLDERS[entry.name], options, "dataset")
        if not folder.is_dir():
            layout = ("<corruption>/<severity>/<wnid>/*.JPEG" if entry.name == "imagenet-c"
                      else "<corruption>.npy and labels.npy")
            raise FileNotFoundError(f"{entry.name}: folder {folder} not found (expected {layout})")
        dataset = load_corrupted(folder.parent, folder.name)
    return Source(entry.name, dataset, model, checkpoint_path.name)


def digits_source(options: SourceOptions, progress: bool) -> Source:
    """The embedded default: digits, a cached seeded ResNet-20 and the cached DIGITS-C."""
    cache = cache_root(options)
    train_x, train_y = load_digits_split()[:2]
    t = DIGITS_TRAINING
    checkpoint = cache / "digits" / f"source-{t['arch']}-e{t['epochs']}-seed{t['seed']}.pt"
    if not checkpoint.is_file():
        model = train_classifier(train_x, train_y, progress=progress, **t)
        save_checkpoint(model, checkpoint, classes=[str(k) for k in range(10)])
    dataset = load_digits_c(cache, severities=options.severities, progress=progress)
    return Source("digits", dataset, load_checkpoint(checkpoint), checkpoint.name)


def corrupted_npz(path: Path, options: SourceOptions, progress: bool) -> CorruptedDataset:
    """Corrupt the clean ``x``/``y`` of an .npz once; cached by the file's content hash."""
    x, y = load_npz(path, "npz dataset")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    out = cache_root(options) / "built" / f"{path.stem}-C-{digest}"
    return build_corrupted(x, y, out, severities=options.severities, seed=0, progress=progress)
