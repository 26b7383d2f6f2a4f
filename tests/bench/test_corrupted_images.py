"""``bench.sources.corrupted_images``: a dataset entry's corrupted set without a model, built once
and then read from the cache; an npz file's clean arrays checked before anything is built."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from dyntta.bench.config import DatasetEntry
from dyntta.bench.sources import SourceOptions, corrupted_images
from dyntta.data import CORRUPTIONS


@pytest.fixture
def few(tmp_path):
    """A folder holding only an .npz of four clean 32 x 32 images, and options caching there."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(4, 32, 32, 3), dtype=np.uint8)
    y = np.arange(4) % 3
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "few.npz", x=x, y=y)
    options = SourceOptions(str(tmp_path / "data"), str(tmp_path / "cache"), severities=(5,))
    return x, y, options, tmp_path


def test_an_npz_is_corrupted_without_a_model_and_found_again(few):
    x, y, options, tmp_path = few
    dataset, digest = corrupted_images(DatasetEntry("npz", "few.npz"), options)
    assert digest == hashlib.sha256((tmp_path / "data" / "few.npz").read_bytes()).hexdigest()
    assert sorted(dataset.corruptions) == sorted(CORRUPTIONS) and list(dataset.severities) == [5]
    assert np.array_equal(dataset.labels, y)
    assert not np.array_equal(dataset.images("fog", 5), x)
    built = sorted(p.name for p in (tmp_path / "cache" / "built").iterdir())
    again, _ = corrupted_images(DatasetEntry("npz", "few.npz"), options)
    assert sorted(p.name for p in (tmp_path / "cache" / "built").iterdir()) == built
    for corruption in CORRUPTIONS:
        assert np.array_equal(again.images(corruption, 5), dataset.images(corruption, 5))


def test_the_clean_arrays_are_checked_before_anything_is_built(few):
    x, y, options, tmp_path = few
    seen = []

    def refuse(images, labels, path):
        seen.append((images, labels, path.name))
        raise ValueError("not these labels")

    with pytest.raises(ValueError, match="not these labels"):
        corrupted_images(DatasetEntry("npz", "few.npz"), options, check_clean=refuse)
    assert np.array_equal(seen[0][0], x) and np.array_equal(seen[0][1], y)
    assert seen[0][2] == "few.npz"
    assert not (tmp_path / "cache").exists()


def test_an_npz_entry_needs_its_file_and_a_digits_entry_has_no_digest(few, tmp_path):
    _, _, options, _ = few
    with pytest.raises(ValueError, match="needs path"):
        corrupted_images(DatasetEntry("npz"), options)
    with pytest.raises(FileNotFoundError, match="none.npz"):
        corrupted_images(DatasetEntry("npz", "none.npz"), options)
    digits, digest = corrupted_images(
        DatasetEntry("digits"), SourceOptions(cache_dir=str(tmp_path / "d"), severities=(5,),
                                              domains=2))
    assert digest is None and sorted(digits.corruptions) == sorted(CORRUPTIONS[:2])
