"""A model's BN statistics re-estimated on clean images: which of a model's losses come from
source statistics that do not describe the images it is tested on (RESULTS.md, "The
ResNet-8's source statistics do not describe its test images").

:func:`dyntta.models.refresh_statistics` on ``--rows`` of the .npz's images (uncorrupted), in
batches of 100; the checkpoint written loads as the model did. The MLPerf-Tiny
ResNet-8 on the even rows of the CIFAR-10 JPEG test images (the half the models of
``dev_architectures.py`` are trained on; they are tested on the odd rows), or on a random 100 of
them (``--images``, drawn by ``--seed``):

    PYTHONPATH=src python benchmarks/refresh_statistics.py \\
        ../shared/data/resnet8-mlperf-cifar10.pt ../shared/data/cifar10-test-jpeg.npz \\
        --rows even --out ../dev-models/resnet8-refreshed.pt [--images 100 --seed 0]
"""

from __future__ import annotations

import argparse

import torch

from dyntta.arguments import non_negative_int, positive_int
from dyntta.data.datasets import load_npz, to_tensor
from dyntta.models import load_checkpoint, refresh_statistics, save_checkpoint

ROWS = {"even": slice(0, None, 2), "odd": slice(1, None, 2), "all": slice(None)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="the model (as dyntta bench --checkpoint reads it)")
    parser.add_argument("npz", help="clean images: x uint8 (N, H, W, 3), y")
    parser.add_argument("--rows", choices=list(ROWS), default="all")
    parser.add_argument("--images", type=positive_int,
                        help="a random N of those rows (drawn by --seed); all by default")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--out", required=True, help="the checkpoint to write")
    args = parser.parse_args(argv)
    model = load_checkpoint(args.checkpoint)
    images, _ = load_npz(args.npz, "clean images")
    images = images[ROWS[args.rows]]
    if args.images is not None:
        if args.images > len(images):
            parser.error(f"--images {args.images}: the {args.rows} rows hold {len(images)}")
        draw = torch.randperm(len(images), generator=torch.Generator().manual_seed(args.seed))
        images = images[draw[: args.images].numpy()]
    images = to_tensor(images)
    save_checkpoint(refresh_statistics(model, images), args.out)
    print(f"{args.out}: BN statistics of {len(images)} images ({args.rows} rows)")


if __name__ == "__main__":
    main()
