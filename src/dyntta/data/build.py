"""Build a corrupted dataset from a clean one, in the CIFAR-10-C layout, cached and resumable.

Work is split into chunks of images per (corruption, severity); each chunk is corrupted with its
own seed ``SeedSequence([seed, corruption index, severity, chunk])`` and saved as a part file, and
a corruption's ``<corruption>.npy`` is assembled from its parts once all exist. Every file is
written to a temporary name and renamed, so an interrupted build leaves only whole files, and a
rerun with the same arguments skips finished corruptions and parts and produces the same bytes.
``meta.json`` records what the folder was built from; a rerun with other inputs or settings is
refused rather than mixed in.

Builds of one folder take turns (a ``flock`` on ``<out>/.lock``); each starts by removing what a
killed build left behind, and nothing else: its own temporary files and the parts of corruptions
it does not build now. A non-empty folder without ``meta.json`` is refused, not written into.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

from dyntta.atomic import atomic_path
from dyntta.data.corruptions import CORRUPTIONS, RECIPES, corrupt, recipe_for
from dyntta.data.datasets import (
    LABELS_FILE,
    META_FILE,
    SEVERITIES,
    NpyCorruptedDataset,
    check_images,
    check_labels,
)
from dyntta.data.frost import SOURCES as FROST_SOURCES

FORMAT = "dyntta-corrupted/1"
PARTS = ".parts"
LOCK = ".lock"


def save_npy(path: Path, array: np.ndarray) -> None:
    """``np.save`` to ``path`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.save(handle, array)


def default_chunk_size(height: int, width: int) -> int:
    """Images per chunk: 1000 at 32x32, 66 at 224x224 (about 10 M values per chunk)."""
    return max(1, min(1000, 10_000_000 // (height * width * 3)))


def fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    """SHA-256 of the clean images and labels (to tell a resumed build from a different one)."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(images).data)
    digest.update(np.ascontiguousarray(labels.astype(np.int64)).data)
    return digest.hexdigest()


def build_corrupted(
    images: np.ndarray,
    labels: np.ndarray,
    out_dir: str | os.PathLike,
    corruptions: Sequence[str] = CORRUPTIONS,
    severities: Sequence[int] = SEVERITIES,
    seed: int = 0,
    progress: bool = True,
    recipe: str | None = None,
    frost_textures: str = "procedural",
    chunk_size: int | None = None,
) -> NpyCorruptedDataset:
    """Corrupt a clean labelled set and write it to ``out_dir`` in the CIFAR-10-C layout.

    Args:
        images: (N, H, W, 3) uint8 clean images; labels: (N,) integer labels.
        out_dir: the folder to write (``<corruption>.npy`` with the severities stacked in order,
            ``labels.npy`` repeated once per severity, ``meta.json``).
        corruptions: names from :data:`CORRUPTIONS` (default all 15).
        severities: a subset of 1..5 (default all).
        seed: seeds every chunk (see the module docstring); same seed, same bytes.
        progress: show a progress bar (tqdm, on stderr).
        recipe, frost_textures: as for :func:`dyntta.data.corrupt` (recipe default by image size).
        chunk_size: images per chunk (default :func:`default_chunk_size`); part of the cache key.

    Returns:
        The built set, opened with :class:`NpyCorruptedDataset`.
    """
    check_images(images, "images")
    labels = np.asarray(labels)
    check_labels(labels, "labels")
    if len(labels) != len(images):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    unknown = [c for c in corruptions if c not in CORRUPTIONS]
    if unknown or not corruptions or isinstance(corruptions, str):
        raise ValueError(f"corruptions must be names from {', '.join(CORRUPTIONS)}; got {corruptions!r}")
    severities = sorted(set(severities))
    if not severities or any(s not in SEVERITIES for s in severities):
        raise ValueError(f"severities must be a non-empty subset of 1..5, got {severities}")
    h, w = images.shape[1:3]
    recipe = recipe_for(h, w) if recipe is None else recipe
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; expected one of {', '.join(RECIPES)}")
    if frost_textures not in FROST_SOURCES:
        raise ValueError(f"unknown frost_textures {frost_textures!r}; expected one of {', '.join(FROST_SOURCES)}")
    chunk_size = default_chunk_size(h, w) if chunk_size is None else int(chunk_size)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")

    out = Path(out_dir)
    with _turn(out):
        meta = {
            "format": FORMAT,
            "n": len(images),
            "shape": [h, w],
            "severities": severities,
            "seed": seed,
            "recipe": recipe,
            "frost_textures": frost_textures,
            "chunk_size": chunk_size,
            "fingerprint": fingerprint(images, labels),
        }
        _claim(out, meta)
        save_npy(out / LABELS_FILE, np.tile(labels.astype(np.int64), len(severities)))

        starts = range(0, len(images), chunk_size)
        todo = [c for c in corruptions if not _complete(out / f"{c}.npy", len(severities) * len(images))]
        _clean_leftovers(out, todo)
        bar = tqdm(total=len(todo) * len(severities) * len(starts), disable=not progress or not todo,
                   unit="chunk", desc="make-c")
        with bar:
            for name in todo:
                parts = out / PARTS / name
                for severity in severities:
                    bar.set_postfix_str(f"{name} s{severity}")
                    for chunk, start in enumerate(starts):
                        part = parts / f"s{severity}-c{chunk}.npy"
                        if not part.is_file():
                            key = np.random.SeedSequence([seed, CORRUPTIONS.index(name), severity, chunk])
                            batch = images[start : start + chunk_size]
                            save_npy(part, corrupt(batch, name, severity, key, recipe, frost_textures))
                        bar.update()
                _assemble(out / f"{name}.npy", parts, severities, len(starts), images.shape)
        if (out / PARTS).is_dir() and not any((out / PARTS).iterdir()):
            (out / PARTS).rmdir()
    return NpyCorruptedDataset(out)


@contextlib.contextmanager
def _turn(out: Path):
    """Hold ``out`` for one build: wait while another process builds it."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _clean_leftovers(out: Path, todo: Sequence[str]) -> None:
    """Remove what a killed build left, and only that: this tool's temporary files
    (``.<output>.<random>.tmp`` for its own outputs, see :func:`dyntta.atomic.atomic_path`) and
    the part folders of corruptions not in ``todo``."""
    outputs = [f"{c}.npy" for c in CORRUPTIONS] + [LABELS_FILE, META_FILE]
    for name in outputs:
        for tmp in out.glob(f".{name}.*.tmp"):
            tmp.unlink(missing_ok=True)
    parts = out / PARTS
    if parts.is_dir():
        for folder in parts.iterdir():
            if folder.name in CORRUPTIONS and folder.name not in todo:
                shutil.rmtree(folder)


def _claim(out: Path, meta: dict) -> None:
    """Write ``meta.json`` to a new or empty folder, or check that an existing build used the
    same inputs; a non-empty folder that no build made is refused (its files are the user's)."""
    path = out / META_FILE
    if path.is_file():
        old = json.loads(path.read_text())
        changed = sorted(k for k in meta if old.get(k) != meta[k])
        if changed:
            raise ValueError(
                f"{out} holds a build made with other {', '.join(changed)} ({path}); "
                f"use another folder or delete it"
            )
        return
    others = sorted(p.name for p in out.iterdir() if p.name != LOCK)
    if others:
        raise ValueError(f"{out} is not empty ({', '.join(others[:3])}"
                         f"{', ...' if len(others) > 3 else ''}) and holds no build of this tool "
                         f"(no {META_FILE}): give a new or empty folder")
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(meta, indent=1))


def _complete(path: Path, rows: int) -> bool:
    if not path.is_file():
        return False
    try:
        array = np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError):
        return False
    return array.shape[0] == rows and array.dtype == np.uint8


def _assemble(path: Path, parts: Path, severities: Sequence[int], n_chunks: int, shape: tuple) -> None:
    """Concatenate the part files of one corruption into ``path`` (atomically), then drop them."""
    n = shape[0]
    with atomic_path(path) as tmp:
        array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(severities) * n, *shape[1:]))
        row = 0
        for severity in severities:
            for chunk in range(n_chunks):
                block = np.load(parts / f"s{severity}-c{chunk}.npy")
                array[row : row + len(block)] = block
                row += len(block)
        array.flush()
        del array
    shutil.rmtree(parts)
