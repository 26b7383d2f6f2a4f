"""Corruptions, corrupted-dataset loaders and builders, dynamic test streams.

    from dyntta.data import load_corrupted, make_stream
    dataset = load_corrupted("/data", "CIFAR-10-C")             # or load_digits_c() (no download)
    stream = make_stream(dataset, n_domains=15, scenario="crossmix", batch_size=64, seed=0)
    for batch in stream:                                        # batch.x (B, 3, H, W) in [0, 1]
        ...
"""

from dyntta.data.build import build_corrupted
from dyntta.data.corruptions import CORRUPTIONS, corrupt
from dyntta.data.datasets import (
    SEVERITIES,
    ArrayCorruptedDataset,
    CorruptedDataset,
    ImageFolderCorruptedDataset,
    NpyCorruptedDataset,
    load_corrupted,
    load_npz,
)
from dyntta.data.digits import default_cache_dir, load_digits_c, load_digits_split
from dyntta.data.streams import SCENARIOS, Batch, Domain, Stream, label_shift_order, make_stream

__all__ = [
    "ArrayCorruptedDataset",
    "Batch",
    "CORRUPTIONS",
    "CorruptedDataset",
    "Domain",
    "ImageFolderCorruptedDataset",
    "NpyCorruptedDataset",
    "SCENARIOS",
    "SEVERITIES",
    "Stream",
    "build_corrupted",
    "corrupt",
    "default_cache_dir",
    "label_shift_order",
    "load_corrupted",
    "load_digits_c",
    "load_digits_split",
    "load_npz",
    "make_stream",
]
