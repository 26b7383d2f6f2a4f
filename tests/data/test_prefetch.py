"""Background prefetch of stream batches: identical results, bounded look-ahead."""

from __future__ import annotations

import threading
import time

import numpy as np
import PIL
import pytest
import torch
from PIL import Image

import dyntta
from dyntta.data import ImageFolderCorruptedDataset, make_stream
from dyntta.data.streams import LAZY_PREFETCH, Stream
from tests.conftest import tiny_resnet


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory):
    """An ImageNet-C-layout folder: 3 corruptions x severity 5 x 3 classes x 6 JPEGs of 16x16."""
    root = tmp_path_factory.mktemp("imagenet-c")
    rng = np.random.default_rng(0)
    for corruption in ("fog", "snow", "contrast"):
        for wnid in ("n01", "n02", "n03"):
            folder = root / corruption / "5" / wnid
            folder.mkdir(parents=True)
            for i in range(6):
                image = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(image).save(folder / f"{i}.JPEG", quality=90)
    return root


def batches(stream: Stream) -> list:
    return list(stream)


@pytest.mark.parametrize("scenario", ["crossmix", "shuffle"])
def test_prefetched_batches_are_identical_to_sequential_ones(jpeg_folder, scenario):
    dataset = ImageFolderCorruptedDataset(jpeg_folder)
    kwargs = dict(corruptions=["fog", "snow", "contrast"], scenario=scenario, batch_size=5, seed=3)
    sequential = batches(make_stream(dataset, prefetch=0, **kwargs))
    for prefetch in (1, 3, 100):
        ahead = batches(make_stream(dataset, prefetch=prefetch, **kwargs))
        assert len(ahead) == len(sequential)
        for a, b in zip(ahead, sequential):
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.domain, b.domain)


def test_adaptation_results_are_identical_with_and_without_prefetch(jpeg_folder):
    dataset = ImageFolderCorruptedDataset(jpeg_folder)
    logits = {}
    for prefetch in (0, 2):
        method = dyntta.adapt(tiny_resnet(num_classes=3), "dyn")
        stream = make_stream(dataset, corruptions=["fog", "snow"], batch_size=4, seed=0,
                             prefetch=prefetch)
        with torch.no_grad():
            logits[prefetch] = torch.cat([method(batch.x) for batch in stream])
    assert torch.equal(logits[0], logits[2])


def test_lazy_sets_prefetch_by_default_and_arrays_do_not(jpeg_folder):
    stream = make_stream(ImageFolderCorruptedDataset(jpeg_folder), corruptions=["fog"])
    assert stream.prefetch == LAZY_PREFETCH > 0
    arrays = {("fog", 5): np.zeros((4, 8, 8, 3), np.uint8)}
    assert make_stream(dyntta.data.ArrayCorruptedDataset(arrays, np.arange(4)),
                       corruptions=["fog"]).prefetch == 0
    with pytest.raises(ValueError, match="prefetch must be an int >= 0"):
        make_stream(ImageFolderCorruptedDataset(jpeg_folder), corruptions=["fog"], prefetch=-1)


class CountingStream(Stream):
    """Records which batches were gathered, and in which thread."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gathered: list[tuple[int, str]] = []

    def __getitem__(self, index):
        self.gathered.append((index, threading.current_thread().name))
        return super().__getitem__(index)


def counting(stream: Stream, prefetch: int) -> CountingStream:
    return CountingStream(stream.dataset, stream.domains, stream.plan, stream.scenario,
                          stream.batch_size, stream.rounds, stream.seed, stream.delta, prefetch)


@pytest.mark.parametrize("prefetch", [1, 2])
def test_look_ahead_is_bounded_and_runs_in_background_threads(jpeg_folder, prefetch):
    base = make_stream(ImageFolderCorruptedDataset(jpeg_folder), corruptions=["fog", "snow"],
                       batch_size=2, seed=0)
    stream = counting(base, prefetch)
    iterator = iter(stream)
    next(iterator)
    time.sleep(0.3)  # let the workers run as far ahead as they may
    assert len(stream.gathered) <= 1 + prefetch
    assert all(name.startswith("dyntta-prefetch") for _, name in stream.gathered)
    iterator.close()  # an early stop shuts the workers down
    assert len(stream.gathered) <= 1 + prefetch
    assert not any(t.name.startswith("dyntta-prefetch") for t in threading.enumerate())


def test_a_broken_file_fails_at_its_batch_as_without_prefetch(jpeg_folder, tmp_path):
    import shutil

    root = tmp_path / "set"
    shutil.copytree(jpeg_folder / "fog", root / "fog")
    (root / "fog" / "5" / "n03" / "5.JPEG").write_bytes(b"not a jpeg")
    stream = make_stream(ImageFolderCorruptedDataset(root), corruptions=["fog"], batch_size=6,
                         scenario="continual", seed=0, prefetch=2)
    with pytest.raises(PIL.UnidentifiedImageError, match="5.JPEG"):
        list(stream)
