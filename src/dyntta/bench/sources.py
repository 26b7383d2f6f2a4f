"""Where a benchmark's test data and source model come from.

Dataset kinds (``DatasetEntry.name``):

- ``digits``: the embedded default. scikit-learn's digits (upsampled to 32x32 RGB, fixed split);
  the ResNet-20 shipped with the package (:data:`DIGITS_MODEL`, trained on its training part by
  ``dyntta train``, so every machine adapts the same weights; ``--checkpoint`` replaces it) and
  its test part corrupted by the 15 CIFAR-10-C corruptions at the severities asked for (cached).
  Needs no download.
- ``cifar10-c`` / ``cifar100-c``: a published set in the CIFAR-10-C layout
  (``<path>/<corruption>.npy``, ``labels.npy``); ``path`` defaults to ``CIFAR-10-C`` /
  ``CIFAR-100-C`` under ``--data-dir``. Needs a checkpoint.
- ``imagenet-c``: ImageNet-C's folder layout (``<path>/<corruption>/<severity>/<wnid>/*.JPEG``).
  Needs a checkpoint.
- ``npz``: a clean test set in an ``.npz`` (``x`` uint8 (N, H, W, 3), ``y`` labels), corrupted
  here once (the severities asked for) and cached (e.g. ``../shared/data/cifar10-test-jpeg.npz``). Needs a checkpoint.

Relative paths are resolved against ``--data-dir`` (default: the current folder); caches live in ``--cache-dir`` (default
``$DYNTTA_CACHE`` or ``~/.cache/dyntta``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from pathlib import Path

from torch import nn

from dyntta.bench.config import DatasetEntry
from dyntta.data import (
    SEVERITIES,
    CorruptedDataset,
    build_corrupted,
    default_cache_dir,
    load_corrupted,
    load_digits_c,
    load_npz,
)
from dyntta.data.datasets import LABELS_FILE, check_labels
from dyntta.models import load_checkpoint

DATASETS = ("digits", "cifar10-c", "cifar100-c", "imagenet-c", "npz")
DEFAULT_FOLDERS = {"cifar10-c": "CIFAR-10-C", "cifar100-c": "CIFAR-100-C", "imagenet-c": "ImageNet-C"}
CLASSES = {"digits": 10, "cifar10-c": 10, "cifar100-c": 100}
"""The number of classes of the dataset kinds that fix it; their model must have exactly these
(ImageNet-C's folders and ``npz`` files bring their own labels, checked against the model's)."""

DIGITS_MODEL = "models/digits-resnet20.pt"
"""The embedded default's source model, in the package (``dyntta train --out ...`` with its
defaults: ResNet-20, 15 epochs, seed 0; see the README for its sha256)."""


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
    checkpoint_sha256: str


def cache_root(options: SourceOptions) -> Path:
    return Path(options.cache_dir).expanduser() if options.cache_dir else default_cache_dir()


def resolve_path(path: str, options: SourceOptions) -> Path:
    """``path`` itself if absolute, else under ``options.data_dir`` (default: the current
    folder)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(options.data_dir or ".").expanduser() / p


def resolve_source(
    entry: DatasetEntry, options: SourceOptions = SourceOptions(), progress: bool = True
) -> Source:
    """Open the dataset of ``entry`` and load (or train, for ``digits``) its source model."""
    if entry.name not in DATASETS:
        raise ValueError(f"unknown dataset {entry.name!r}; valid: {', '.join(DATASETS)}")
    if entry.name == "digits" and entry.path is not None:
        raise ValueError("dataset 'digits' is embedded and takes no path (for images of your own "
                         "give dataset 'npz' with the .npz file as its path)")
    checkpoint = options.checkpoint or entry.checkpoint
    if checkpoint is None and entry.name != "digits":
        raise ValueError(f"dataset {entry.name!r} needs a model: give --checkpoint PATH")
    if checkpoint is None:
        checkpoint_path = Path(__file__).parent / DIGITS_MODEL
    else:
        checkpoint_path = resolve_path(checkpoint, options)
    model = load_checkpoint(checkpoint_path)
    classes = model.net.get_submodule(model.net.head).out_features
    expected = CLASSES.get(entry.name)
    folder = None
    if entry.name not in ("digits", "npz"):  # the data's place is checked before the model fits
        folder = corrupted_folder(entry, options)
    if expected is not None and classes != expected:
        raise ValueError(f"{checkpoint_path.name} has {classes} classes but {entry.name} has "
                         f"{expected}: give a model trained on its classes")
    if entry.name == "digits":
        dataset = load_digits_c(cache_root(options), severities=options.severities,
                                progress=progress)
    elif entry.name == "npz":
        if entry.path is None:
            raise ValueError("dataset 'npz' needs path = the .npz file of clean test images")
        dataset = corrupted_npz(resolve_path(entry.path, options), options, progress, classes)
    else:
        dataset = load_corrupted(folder.parent, folder.name)
    check_labels(dataset.labels, f"dataset {entry.name!r} with {checkpoint_path.name}", classes)
    used = int(dataset.labels.max()) + 1
    if expected is None and used < classes:
        warnings.warn(f"dataset {entry.name!r}: its labels use classes 0..{used - 1} of the "
                      f"{classes} of {checkpoint_path.name}; check that they are the model's "
                      "classes", stacklevel=2)
    return Source(entry.name, dataset, model, checkpoint_path.name, file_sha256(checkpoint_path))


def corrupted_folder(entry: DatasetEntry, options: SourceOptions) -> Path:
    """The folder of a published corrupted set, checked to have its kind's layout."""
    folder = resolve_path(entry.path or DEFAULT_FOLDERS[entry.name], options)
    images = entry.name == "imagenet-c"
    layout = "<corruption>/<severity>/<wnid>/*.JPEG" if images else \
        "<corruption>.npy and labels.npy"
    if not folder.is_dir():
        raise FileNotFoundError(f"{entry.name}: folder {folder} not found (expected {layout})")
    if not images and not (folder / LABELS_FILE).is_file():
        raise FileNotFoundError(f"{entry.name}: {folder} holds no {LABELS_FILE} (expected "
                                f"{layout}, e.g. from dyntta download or dyntta make-c)")
    return folder


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def corrupted_npz(path: Path, options: SourceOptions, progress: bool,
                  num_classes: int) -> CorruptedDataset:
    """Corrupt the clean ``x``/``y`` of an .npz once (labels checked against the model's
    ``num_classes`` first); cached by the file's content hash."""
    x, y = load_npz(path, "npz dataset")
    check_labels(y, str(path), num_classes)
    digest = file_sha256(path)[:12]
    out = cache_root(options) / "built" / f"{path.stem}-C-{digest}"
    return build_corrupted(x, y, out, severities=options.severities, seed=0, progress=progress)
