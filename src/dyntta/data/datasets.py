"""Corrupted datasets: one clean labelled test set, corrupted by several corruptions and severities.

Every dataset answers ``images(corruption, severity)`` with an (N, H, W, 3) uint8 array-like whose
row ``i`` is the corrupted version of clean sample ``i`` (label ``labels[i]``) and that supports
``array[rows]`` for an integer index array: a ``numpy.memmap`` for the CIFAR-10-C layout, a lazy
JPEG reader for the ImageNet-C layout, or a plain array.

Layouts read (Hendrycks & Dietterich, ICLR 2019, "Benchmarking Neural Network Robustness to Common
Corruptions and Perturbations"; the published data sets):

- CIFAR-10-C / CIFAR-100-C: ``<dir>/<corruption>.npy`` of shape (5 N, H, W, 3) uint8, severities
  1..5 stacked in order, and ``<dir>/labels.npy`` with N or 5 N labels (the published file
  repeats the N labels for every severity). Sets written by :func:`dyntta.data.build_corrupted`
  use the same layout plus ``meta.json`` naming the severities they hold (any subset of 1..5).
- ImageNet-C: ``<dir>/<corruption>/<severity>/<wnid>/<file>.JPEG``; the label of a file is the
  index of its ``wnid`` among the sorted class folders, rows are ordered by (wnid, file name).
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
from PIL import Image

SEVERITIES = (1, 2, 3, 4, 5)
META_FILE = "meta.json"
LABELS_FILE = "labels.npy"
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")


class CorruptedDataset:
    """Base class: labels, the available corruptions and severities, and ``images(c, s)``.

    Args:
        name: a display name (the folder name for loaded sets).
        labels: (N,) integer class labels, shared by every corruption and severity.
        corruptions: names of the corruptions this set holds.
        severities: the severities (in 1..5) this set holds.
        num_classes: number of classes (default ``labels.max() + 1``).
    """

    def __init__(
        self,
        name: str,
        labels: np.ndarray,
        corruptions: Sequence[str],
        severities: Sequence[int],
        num_classes: int | None = None,
    ) -> None:
        labels = np.asarray(labels)
        check_labels(labels, name)
        bad = [s for s in severities if s not in SEVERITIES]
        if bad or not severities:
            raise ValueError(f"{name}: severities must be a non-empty subset of 1..5, got {severities}")
        self.name = name
        self.labels = labels.astype(np.int64)
        self.corruptions = tuple(corruptions)
        self.severities = tuple(sorted(severities))
        self.num_classes = int(labels.max()) + 1 if num_classes is None else int(num_classes)

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, n={len(self)}, classes={self.num_classes}, "
            f"corruptions={len(self.corruptions)}, severities={self.severities})"
        )

    def images(self, corruption: str, severity: int):
        """The (N, H, W, 3) uint8 images of one corruption at one severity (array-like)."""
        if corruption not in self.corruptions:
            raise FileNotFoundError(
                f"{self.name}: no corruption {corruption!r}; available: {', '.join(self.corruptions)}"
            )
        if severity not in self.severities:
            raise ValueError(
                f"{self.name}: no severity {severity!r} for {corruption!r}; "
                f"available: {self.severities}"
            )
        return self._images(corruption, severity)

    def _images(self, corruption: str, severity: int):
        raise NotImplementedError


class ArrayCorruptedDataset(CorruptedDataset):
    """A corrupted set held in memory: ``arrays[(corruption, severity)]`` is (N, H, W, 3) uint8."""

    def __init__(
        self,
        arrays: Mapping[tuple[str, int], np.ndarray],
        labels: np.ndarray,
        name: str = "in-memory",
        num_classes: int | None = None,
    ) -> None:
        if not arrays:
            raise ValueError(f"{name}: arrays must hold at least one (corruption, severity) entry")
        corruptions = list(dict.fromkeys(c for c, _ in arrays))
        severities = sorted({s for _, s in arrays})
        missing = [(c, s) for c in corruptions for s in severities if (c, s) not in arrays]
        if missing:
            raise ValueError(f"{name}: every corruption needs every severity; missing {missing}")
        super().__init__(name, labels, corruptions, severities, num_classes)
        for key, array in arrays.items():
            check_images(array, f"{name}[{key}]", rows=len(self.labels))
        self._arrays = dict(arrays)

    def _images(self, corruption: str, severity: int) -> np.ndarray:
        return self._arrays[(corruption, severity)]


class NpyCorruptedDataset(CorruptedDataset):
    """A set in the CIFAR-10-C layout, memory-mapped; only the severity asked for is read.

    Every ``<corruption>.npy`` is validated (shape, dtype, row count, truncation) when the set is
    opened, so a broken file is named at load time rather than mid-run.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        if not directory.is_dir():
            raise FileNotFoundError(f"corrupted dataset folder {directory} does not exist")
        labels_path = directory / LABELS_FILE
        if not labels_path.is_file():
            raise FileNotFoundError(f"{labels_path} is missing (expected the labels of {directory})")
        severities, n = _read_meta(directory)
        n_source = META_FILE if n is not None else None
        files = sorted(p for p in directory.glob("*.npy") if p.name != LABELS_FILE)
        if not files:
            raise FileNotFoundError(f"{directory} holds no <corruption>.npy file besides {LABELS_FILE}")
        arrays = {}
        for path in files:
            arrays[path.stem] = _open_npy(path)
            check_images(arrays[path.stem], str(path))
        if n is None:  # published layout: N from the first array, severities 1..5 stacked
            rows = len(arrays[files[0].stem])
            if rows % len(severities):
                raise ValueError(f"{files[0]}: {rows} rows is not {len(severities)} severities x N")
            n, n_source = rows // len(severities), files[0].name
        labels = _open_npy(labels_path)
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(
                f"{labels_path}: expected a 1-D integer array, got shape {labels.shape} "
                f"dtype {labels.dtype}"
            )
        what = f"{labels_path} (N = {n} from {n_source})"
        labels = _single_copy_of_labels(np.asarray(labels), len(severities), n, what)
        for path in files:
            check_images(arrays[path.stem], str(path), rows=len(severities) * n)
        super().__init__(directory.name, labels, list(arrays), severities)
        self.directory = directory
        self._arrays = arrays

    def _images(self, corruption: str, severity: int) -> np.ndarray:
        n = len(self.labels)
        block = self.severities.index(severity)
        return self._arrays[corruption][block * n : (block + 1) * n]


class ImageFolderCorruptedDataset(CorruptedDataset):
    """A set in the ImageNet-C layout ``<dir>/<corruption>/<severity>/<wnid>/<file>``.

    The class list and file order come from the first (corruption, severity) folder; every other
    folder must hold the same relative file list (checked when first read).
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        if not directory.is_dir():
            raise FileNotFoundError(f"corrupted dataset folder {directory} does not exist")
        corruptions = sorted(p.name for p in directory.iterdir() if _severity_dirs(p))
        if not corruptions:
            raise FileNotFoundError(
                f"{directory} holds no <corruption>/<severity>/<class>/ folders (ImageNet-C layout)"
            )
        severities = sorted(set.union(*(set(_severity_dirs(directory / c)) for c in corruptions)))
        reference = directory / corruptions[0] / str(_severity_dirs(directory / corruptions[0])[0])
        self.classes, self._files = _list_image_folder(reference)
        index = {wnid: i for i, wnid in enumerate(self.classes)}
        labels = np.array([index[f.split("/")[0]] for f in self._files], dtype=np.int64)
        super().__init__(directory.name, labels, corruptions, severities, len(self.classes))
        self.directory = directory
        self._checked: dict[Path, LazyImageFiles] = {}

    def _images(self, corruption: str, severity: int) -> LazyImageFiles:
        folder = self.directory / corruption / str(severity)
        if folder not in self._checked:
            if not folder.is_dir():
                raise FileNotFoundError(f"{folder} is missing (severity {severity} of {corruption})")
            _, files = _list_image_folder(folder)
            if files != self._files:
                extra = sorted(set(files) - set(self._files))[:3]
                lost = sorted(set(self._files) - set(files))[:3]
                raise ValueError(
                    f"{folder}: its files differ from the reference list of {len(self._files)} "
                    f"files (extra: {extra}, missing: {lost})"
                )
            self._checked[folder] = LazyImageFiles([folder / f for f in files])
        return self._checked[folder]


class LazyImageFiles:
    """An (N, H, W, 3) uint8 array-like over image files, decoded only when indexed."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        first = _read_image(self.paths[0])
        self.shape = (len(self.paths), *first.shape)
        self.dtype = np.dtype(np.uint8)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, rows) -> np.ndarray:
        rows = np.arange(len(self.paths))[rows]
        if rows.ndim == 0:
            return self._read(int(rows))
        out = np.empty((len(rows), *self.shape[1:]), dtype=np.uint8)
        for i, row in enumerate(rows):
            out[i] = self._read(int(row))
        return out

    def _read(self, row: int) -> np.ndarray:
        image = _read_image(self.paths[row])
        if image.shape != self.shape[1:]:
            raise ValueError(
                f"{self.paths[row]}: image of shape {image.shape}, expected {self.shape[1:]} like "
                f"{self.paths[0].name}"
            )
        return image


def load_corrupted(root: str | os.PathLike, name: str) -> CorruptedDataset:
    """Open ``<root>/<name>`` in the CIFAR-10-C layout (``*.npy``) or the ImageNet-C layout.

    Example: ``load_corrupted("/data", "CIFAR-10-C")``, ``load_corrupted("/data", "ImageNet-C")``.
    """
    directory = Path(root) / name
    if not directory.is_dir():
        raise FileNotFoundError(f"corrupted dataset folder {directory} does not exist")
    if (directory / LABELS_FILE).exists() or any(directory.glob("*.npy")):
        return NpyCorruptedDataset(directory)
    return ImageFolderCorruptedDataset(directory)


def load_npz(path: str | os.PathLike, what: str = "npz file", labels: bool = True
             ) -> tuple[np.ndarray, np.ndarray | None]:
    """The arrays ``x`` (images, (N, H, W, 3) uint8) and ``y`` (labels; with ``labels=False``
    not needed and None) of an .npz file; a missing, unreadable or truncated file, a plain
    ``.npy``, a missing array or labels not one per image is an error naming it (``what`` says
    what the file is for)."""
    path = Path(path)
    names = ("x", "y") if labels else ("x",)
    arrays = " and ".join(names)
    saved = "numpy.savez(path, x=images, y=labels)" if labels else "numpy.savez(path, x=images)"
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path} (expected an .npz with arrays {arrays})")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        raise ValueError(f"{path}: a single .npy array, not an .npz archive of {arrays} (write "
                         f"one with {saved})")
    if not magic.startswith(b"PK"):
        raise ValueError(f"{path}: not an .npz archive (no zip header: a text file or another "
                         f"format?); expected arrays {arrays} saved by numpy.savez")
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = set(names) - set(archive.files)
            if missing:
                raise ValueError(f"{path}: missing arrays {sorted(missing)}; it holds "
                                 f"{archive.files}")
            x, y = archive["x"], archive["y"] if labels else None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise ValueError(f"{path}: a damaged or truncated .npz archive ({exc})") from None
    except ValueError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise ValueError(f"{path}: a damaged or truncated .npz archive ({exc})") from None
    if y is not None and x.ndim and y.ndim and len(x) != len(y):  # else its checks name it
        raise ValueError(f"{path}: {len(x)} images (x) but {len(y)} labels (y)")
    return x, y


def check_labels(labels: np.ndarray, what: str, num_classes: int | None = None) -> None:
    """Raise ``ValueError`` unless ``labels`` is a non-empty 1-D integer array with values in
    ``0 .. num_classes - 1`` (``>= 0`` if ``num_classes`` is None)."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"{what}: labels must be a non-empty 1-D integer array, "
            f"got shape {labels.shape} dtype {labels.dtype}"
        )
    if labels.min() < 0:
        raise ValueError(f"{what}: labels must be >= 0 (class indices), got {labels.min()}")
    if num_classes is not None and labels.max() >= num_classes:
        raise ValueError(
            f"{what}: labels go up to {labels.max()} but the model has {num_classes} classes "
            f"(0..{num_classes - 1}); use a model trained on these classes"
        )


def check_images(array, what: str, rows: int | None = None) -> None:
    """Raise ``ValueError`` unless ``array`` is (rows, H, W, 3) uint8."""
    shape = tuple(getattr(array, "shape", ()))
    if len(shape) != 4 or shape[-1] != 3 or getattr(array, "dtype", None) != np.uint8:
        raise ValueError(
            f"{what}: expected uint8 images of shape (N, H, W, 3), got shape {shape} "
            f"dtype {getattr(array, 'dtype', type(array).__name__)}"
        )
    if rows is not None and shape[0] != rows:
        raise ValueError(f"{what}: expected {rows} rows, got {shape[0]}")


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 images (N, H, W, C) -> float32 (N, C, H, W) in [0, 1], as streams feed models."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div_(255.0)


def _open_npy(path: Path) -> np.ndarray:
    """Memory-map a .npy file; a truncated or unreadable file raises ``ValueError`` naming it."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npy array (truncated or corrupt?): {exc}") from exc


def _read_meta(directory: Path) -> tuple[list[int], int | None]:
    """Severities held and clean size N from ``meta.json`` (published sets: 1..5, N unknown)."""
    path = directory / META_FILE
    if not path.is_file():
        return list(SEVERITIES), None
    try:
        meta = json.loads(path.read_text())
        return [int(s) for s in meta["severities"]], int(meta["n"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: expected JSON with 'severities' and 'n' ({exc})") from exc


def _single_copy_of_labels(labels: np.ndarray, blocks: int, n: int, path: str) -> np.ndarray:
    """The N labels from a file holding N or ``blocks`` * N of them (identical blocks)."""
    if len(labels) == n:
        return labels
    if len(labels) != blocks * n:
        raise ValueError(
            f"{path}: {len(labels)} labels, expected {n} (the images per severity) or {blocks} x {n}"
        )
    stacked = labels.reshape(blocks, n)
    if not (stacked == stacked[0]).all():
        raise ValueError(f"{path}: the {blocks} blocks of {n} labels (one per severity) differ")
    return stacked[0]


def _severity_dirs(path: Path) -> list[int]:
    if not path.is_dir():
        return []
    names = {str(s) for s in SEVERITIES}
    return sorted(int(p.name) for p in path.iterdir() if p.is_dir() and p.name in names)


def _list_image_folder(folder: Path) -> tuple[list[str], list[str]]:
    """Sorted class folders and the sorted ``<class>/<file>`` list of image files under them."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    files = [
        f"{c}/{name}"
        for c in classes
        for name in sorted(os.listdir(folder / c))
        if name.lower().endswith(IMAGE_EXTENSIONS)
    ]
    if not files:
        raise FileNotFoundError(f"{folder} holds no <class>/<image> files")
    return classes, files


def _read_image(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"), dtype=np.uint8)
