"""``dyntta make-c``: build a corrupted dataset (CIFAR-10-C layout) from a clean one;
``dyntta download``: fetch a published one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from dyntta.arguments import non_negative_int, path, positive_int
from dyntta.data.build import build_corrupted
from dyntta.data.corruptions import CORRUPTIONS, RECIPES
from dyntta.data.datasets import SEVERITIES, load_npz
from dyntta.data.download import DATASETS, download
from dyntta.data.digits import load_digits_split
from dyntta.data.frost import SOURCES as FROST_SOURCES


def expanded(text: str) -> Path:
    """A path argument with ``~`` expanded."""
    return Path(path(text))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        help="'digits' (the embedded scikit-learn digits test split) or a .npz file with arrays "
        "x (N, H, W, 3) uint8 and y (N,) integer labels",
    )
    parser.add_argument("out", type=expanded, help="output folder (<corruption>.npy, labels.npy, meta.json)")
    parser.add_argument("--corruptions", nargs="+", default=list(CORRUPTIONS), choices=CORRUPTIONS,
                        metavar="NAME", help="corruptions to build (default: all 15)")
    parser.add_argument("--severities", nargs="+", type=int, default=list(SEVERITIES), choices=SEVERITIES,
                        metavar="S", help="severities to build (default: 1 2 3 4 5)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default 0)")
    parser.add_argument("--recipe", choices=RECIPES, default=None,
                        help="parameter recipe (default: by image size, cifar 32x32, imagenet 224x224)")
    parser.add_argument("--frost-textures", choices=FROST_SOURCES, default="procedural",
                        help="frost texture source (default procedural)")
    parser.add_argument("--chunk-size", type=positive_int, default=None, help="images per work chunk")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def load_source(source: str) -> tuple[np.ndarray, np.ndarray]:
    """Clean images and labels from 'digits' or a .npz file holding x and y."""
    if source == "digits":
        _, _, x, y = load_digits_split()
        return x, y
    return load_npz(source, "source ('digits' or an .npz file)")


def run(args: argparse.Namespace) -> int:
    images, labels = load_source(args.source)
    try:
        dataset = build_corrupted(
            images,
            labels,
            args.out,
            corruptions=args.corruptions,
            severities=args.severities,
            seed=args.seed,
            progress=not args.no_progress,
            recipe=args.recipe,
            frost_textures=args.frost_textures,
            chunk_size=args.chunk_size,
        )
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"the finished parts are kept in {args.out}; run the same "
                                "command again to resume") from None
    print(
        f"{args.out}: {len(dataset)} images x {len(dataset.corruptions)} corruptions x "
        f"severities {', '.join(map(str, dataset.severities))}"
    )
    return 0


def add_download_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", choices=sorted(DATASETS), help="the published set to fetch")
    parser.add_argument("root", type=expanded,
                        help="data root: the set lands in <root>/CIFAR-10-C, <root>/ImageNet-C, ...")
    parser.add_argument("--parts", nargs="+", metavar="PART", default=None,
                        help="ImageNet-C archives (default: noise blur weather digital; "
                        "'extra' holds the 4 held-out corruptions)")
    parser.add_argument("--keep-archives", action="store_true",
                        help="keep the verified .tar files after extraction")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def run_download(args: argparse.Namespace) -> int:
    try:
        folder = download(args.dataset, args.root, args.parts, args.keep_archives,
                          progress=not args.no_progress)
    except OSError as exc:  # no space left, network failure (ValueError: bad checksum, input)
        print(f"dyntta download: error: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"{folder}: ready (dyntta bench --data-dir {args.root} ...)")
    return 0
