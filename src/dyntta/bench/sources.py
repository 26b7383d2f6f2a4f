"""Where a benchmark's test data and source model come from.

Dataset kinds (``DatasetEntry.name``):

- ``digits``: the embedded default. scikit-learn's digits (upsampled to 32x32 RGB, fixed split);
  the ResNet-20 shipped with the package (:data:`DIGITS_MODEL`, trained on its training part by
  ``dyntta train``, so every machine adapts the same weights; ``--checkpoint`` replaces it) and
  its test part corrupted by the 15 CIFAR-10-C corruptions at the severities asked for (cached).
  Needs no download.
- ``cifar10-c`` / ``cifar100-c``: a published set in the CIFAR-10-C layout
  (``<path>/<corruption>.npy``, ``labels.npy``); ``path`` defaults to ``CIFAR-10-C`` /
  ``CIFAR-100-C`` under ``--data-dir``. Needs a model (a checkpoint or a factory).
- ``imagenet-c``: ImageNet-C's folder layout (``<path>/<corruption>/<severity>/<wnid>/*.JPEG``).
  Needs a model.
- ``npz``: a clean test set in an ``.npz`` (``x`` uint8 (N, H, W, 3), ``y`` labels), corrupted
  here once (the severities and domains asked for, with the entry's ``recipe`` or the one of its
  image size) and cached (e.g. ``../shared/data/cifar10-test-jpeg.npz``). Needs a model.

Relative paths are resolved against ``--data-dir`` (default: the current folder); caches live in ``--cache-dir`` (default
``$DYNTTA_CACHE`` or ``~/.cache/dyntta``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from dyntta.bench.config import DatasetEntry
from dyntta.data import (
    CORRUPTIONS,
    SEVERITIES,
    CorruptedDataset,
    build_corrupted,
    default_cache_dir,
    load_corrupted,
    load_digits_c,
    load_digits_split,
    load_npz,
)
from dyntta.data.corruptions import RECIPE_SIZES
from dyntta.data.datasets import LABELS_FILE, check_images, check_labels, to_tensor
from dyntta.models import statistics_hits
from dyntta.models.checkpoint import weights_fingerprint
from dyntta.models.factory import load_model
from dyntta.models.refresh import statistics_gap
from dyntta.norm.spectrum import MIN_IMAGES

DATASETS = ("digits", "cifar10-c", "cifar100-c", "imagenet-c", "npz")
DEFAULT_FOLDERS = {"cifar10-c": "CIFAR-10-C", "cifar100-c": "CIFAR-100-C", "imagenet-c": "ImageNet-C"}
CLASSES = {"digits": 10, "cifar10-c": 10, "cifar100-c": 100}
"""The number of classes of the dataset kinds that fix it; their model must have exactly these
(ImageNet-C's folders and ``npz`` files bring their own labels, checked against the model's)."""

DIGITS_MODEL = "models/digits-resnet20.pt"
"""The embedded default's source model, in the package (``dyntta train --out ...`` with its
defaults: ResNet-20, 15 epochs, seed 0; see the README for its sha256)."""

REFERENCE_IMAGES = 4096
"""The first clean images of an ``npz`` dataset that are its model's reference (``dyn_adaptive``
reads its source ratios on them; :attr:`Source.reference`)."""

STALE_CHECK_ROWS = 512
"""Clean images of an ``npz`` dataset on which the bench checks that the model's BN statistics
describe them (:func:`warn_if_stale`)."""


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """Where files are: ``data_dir`` for relative paths, ``cache_dir`` for what is built here;
    ``checkpoint`` and ``model`` (a factory's import path, ``package.module:function``) to
    override every dataset's model; the ``severities`` and the first ``domains`` corruptions (of
    :data:`~dyntta.data.CORRUPTIONS`, the streams' order) that sets built here need."""

    data_dir: str | None = None
    cache_dir: str | None = None
    checkpoint: str | None = None
    severities: tuple[int, ...] = SEVERITIES
    model: str | None = None
    domains: int = len(CORRUPTIONS)


@dataclasses.dataclass
class Source:
    """A test set and the source model to adapt on it, with what identifies them: the model's
    name (its checkpoint file, factory or given name), its factory's import path, the sha256 of
    its checkpoint file and of the data file where there is one (``npz``), and a fingerprint of
    the model's weights (:func:`weights_fingerprint`, computed here). ``reference``: clean images
    (n, H, W, 3) uint8 of the model's own domain, for the methods that read them: the digits'
    training split for ``digits``, the first :data:`REFERENCE_IMAGES` clean images of an ``npz``
    file (the test images before corruption); None for a corrupted set without its clean images
    or with fewer than ``MIN_IMAGES`` (32, one group of ``dyn_adaptive``'s reading)."""

    name: str
    dataset: CorruptedDataset
    model: nn.Module
    model_name: str
    checkpoint_sha256: str | None = None
    model_factory: str | None = None
    data_sha256: str | None = None
    reference: np.ndarray | None = None
    weights_sha256: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.weights_sha256 = weights_fingerprint(self.model)

    @property
    def identity(self) -> tuple[tuple[str, str | None], ...]:
        """What a cell's results depend on besides its configuration: (name, value) pairs of the
        model's name, class, factory, checkpoint and weights, and the data file."""
        kind = type(self.model)
        return (("checkpoint_sha256", self.checkpoint_sha256), ("data_sha256", self.data_sha256),
                ("model", self.model_name), ("model_class", f"{kind.__module__}.{kind.__qualname__}"),
                ("model_factory", self.model_factory), ("weights_sha256", self.weights_sha256))


def cache_root(options: SourceOptions) -> Path:
    return Path(options.cache_dir).expanduser() if options.cache_dir else default_cache_dir()


def resolve_path(path: str, options: SourceOptions) -> Path:
    """``path`` itself if absolute, else under ``options.data_dir`` (default: the current
    folder)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(options.data_dir or ".").expanduser() / p


def resolve_source(
    entry: DatasetEntry, options: SourceOptions = SourceOptions(), progress: bool = True,
    quiet: bool = False,
) -> Source:
    """Open the dataset of ``entry`` and load its source model: built by its factory
    (``options.model`` or ``entry.model``) with the checkpoint loaded into it if one is given,
    else a checkpoint of a known architecture (:func:`~dyntta.models.load_checkpoint`), else for
    ``digits`` the model shipped in the package. ``quiet``: as :func:`open_dataset`."""
    check_dataset_name(entry)
    factory = options.model or entry.model
    checkpoint = options.checkpoint or entry.checkpoint
    if checkpoint is None and factory is None and entry.name != "digits":
        raise ValueError(f"dataset {entry.name!r} needs a model: give --checkpoint PATH or "
                         "--model package.module:function")
    if checkpoint is None:
        path = None if factory else Path(__file__).parent / DIGITS_MODEL
    else:
        path = resolve_path(checkpoint, options)
    model = load_model(path, factory)
    return open_dataset(entry, options, progress, model, quiet,
                        model_name=path.name if path else factory,
                        checkpoint_sha256=file_sha256(path) if path else None,
                        model_factory=factory)


@dataclasses.dataclass(frozen=True, eq=False)
class ModelResolver:
    """A resolver (see :func:`dyntta.bench.runner.run_grid`) that adapts ``model`` on every
    dataset of a grid, recorded under ``name``."""

    model: nn.Module
    name: str

    def __call__(self, entry: DatasetEntry, options: SourceOptions, progress: bool,
                 quiet: bool = False) -> Source:
        return open_dataset(entry, options, progress, self.model, quiet, model_name=self.name)


def open_dataset(entry: DatasetEntry, options: SourceOptions, progress: bool, model: nn.Module,
                 quiet: bool = False, **identity: str | None) -> Source:
    """The :class:`Source` of ``model`` on the dataset of ``entry``, once the model's output on
    a few of its images has been checked (:func:`output_classes`) against its labels.
    ``quiet``: skip the checks whose only outcome is a warning (a worker process resolving a
    source the run's own process has already checked)."""
    what = f"dataset {entry.name!r} with model {identity['model_name']}"
    clean = [load_digits_split()[0]] if entry.name == "digits" else []

    def check_clean(x: np.ndarray, y: np.ndarray, path: Path) -> None:
        clean.append(x[:REFERENCE_IMAGES])
        check_labels(y, str(path), output_classes(model, x, what))  # before building the set
        if not quiet:
            warn_if_stale(model, x, y, what)

    dataset, data_sha256 = corrupted_images(entry, options, progress, check_clean)
    first = dataset.images(dataset.corruptions[0], dataset.severities[0])
    classes = output_classes(model, first, what)
    expected = CLASSES.get(entry.name)
    if expected is not None and classes != expected:
        raise ValueError(f"{what}: the model predicts {classes} classes but {entry.name} has "
                         f"{expected}: give a model trained on its classes")
    check_labels(dataset.labels, what, classes)
    used = int(dataset.labels.max()) + 1
    if expected is None and used < classes and not quiet:
        warnings.warn(f"{what}: its labels use classes 0..{used - 1} of the model's {classes}; "
                      "check that they are the model's classes", stacklevel=2)
    reference = clean[0] if clean and len(clean[0]) >= MIN_IMAGES else None
    return Source(entry.name, dataset, model, data_sha256=data_sha256, reference=reference,
                  **identity)


def corrupted_images(
    entry: DatasetEntry, options: SourceOptions, progress: bool = False,
    check_clean: Callable[[np.ndarray, np.ndarray, Path], None] | None = None,
) -> tuple[CorruptedDataset, str | None]:
    """The corrupted test set of ``entry`` as a bench opens it (``digits`` and ``npz`` built
    here once, then cached), and the sha256 of an ``npz`` file (else None); no model needed.
    ``check_clean(x, y, path)`` sees an ``npz`` file's clean images and labels before its set is
    built."""
    check_dataset_name(entry)
    if entry.name == "digits":
        return load_digits_c(cache_root(options), CORRUPTIONS[: options.domains],
                             severities=options.severities, progress=progress), None
    if entry.name == "npz":
        if entry.path is None:
            raise ValueError("dataset 'npz' needs path = the .npz file of clean test images")
        path = resolve_path(entry.path, options)
        x, y = load_npz(path, "npz dataset")
        check_images(x, str(path))
        if check_clean is not None:
            check_clean(x, y, path)
        digest = file_sha256(path)
        return corrupted_npz(x, y, path.stem, digest, options, progress, entry.recipe), digest
    folder = corrupted_folder(entry, options)
    return load_corrupted(folder.parent, folder.name), None


def check_dataset_name(entry: DatasetEntry) -> None:
    if entry.name not in DATASETS:
        raise ValueError(f"unknown dataset {entry.name!r}; valid: {', '.join(DATASETS)}")
    if entry.name == "digits" and entry.path is not None:
        raise ValueError("dataset 'digits' is embedded and takes no path (for images of your own "
                         "give dataset 'npz' with the .npz file as its path)")


def warn_if_stale(model: nn.Module, x: np.ndarray, y: np.ndarray, what: str) -> None:
    """Warn (one line) when the model's own BN statistics do not describe the clean images
    ``x`` (uint8 (N, H, W, 3)) of an ``npz`` dataset: on up to :data:`STALE_CHECK_ROWS` of them
    (a seeded draw, whole batches of 64, at least 4 batches) it scores below TBN beyond the
    paired interval (:func:`~dyntta.models.statistics_hits`), so every method that mixes its
    statistics in starts behind (RESULTS.md: the MLPerf-Tiny ResNet-8); ``dyntta refresh``
    re-estimates them."""
    batches = min(len(x), STALE_CHECK_ROWS) // 64
    layers = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    if batches < 4 or not layers or any(m.running_mean is None for m in layers):
        return  # too few images, or no statistics to judge
    draw = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    rows = draw[: 64 * batches].numpy()
    hits = statistics_hits(model, to_tensor(x[rows]), torch.from_numpy(y[rows]).long(), 64)
    source, tbn, low, high = statistics_gap(hits)
    if high < 0:
        warnings.warn(f"{what}: on {len(rows)} of its clean images the model scores "
                      f"{source:.1f}% with its own BN statistics and {tbn:.1f}% with each batch's "
                      f"(TBN), {source - tbn:+.1f} [{low:+.1f}, {high:+.1f}] points: they do not "
                      "describe these images, so methods that mix them in start behind; "
                      "re-estimate them first (dyntta refresh, docs/models.md)", stacklevel=2)


PROBE_IMAGES = 4


def output_classes(model: nn.Module, images, what: str) -> int:
    """The number of classes ``model`` predicts, from its output on the first
    :data:`PROBE_IMAGES` of ``images`` ((N, H, W, 3) uint8, as a stream feeds them: (B, 3, H, W)
    in [0, 1]), run without gradients in eval mode (its mode is restored). A ``ValueError`` unless
    the output is a floating (B, classes) tensor."""
    rows = np.asarray(images[np.arange(min(PROBE_IMAGES, len(images)))])
    x = to_tensor(rows)
    training = model.training
    try:
        with torch.no_grad():
            out = model.eval()(x)
    finally:
        model.train(training)
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or len(out) != len(x) \
            or not out.is_floating_point():
        got = (f"a {out.dtype} tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor)
               else f"a {type(out).__name__}")
        raise ValueError(f"{what}: the model must return logits (B, classes) for images "
                         f"(B, 3, H, W) in [0, 1]; for {tuple(x.shape)} it returned {got}")
    return out.shape[1]


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


def corrupted_npz(x: np.ndarray, y: np.ndarray, stem: str, digest: str, options: SourceOptions,
                  progress: bool, recipe: str | None = None) -> CorruptedDataset:
    """Corrupt the clean ``x``/``y`` of an .npz once with ``recipe`` (None: by image size);
    cached by the file's content hash ``digest``, the severities (a bench builds its grid's one,
    an analysis all five: as for the digits) and a recipe other than the size's."""
    by_size = RECIPE_SIZES.get(x.shape[1:3])
    severities = "".join(map(str, sorted(set(options.severities))))
    name = f"{stem}-C-{digest[:12]}-s{severities}" + \
        ("" if recipe in (None, by_size) else f"-{recipe}")
    return build_corrupted(x, y, cache_root(options) / "built" / name,
                           CORRUPTIONS[: options.domains], options.severities, seed=0,
                           progress=progress, recipe=recipe)
