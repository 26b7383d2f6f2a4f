"""A model's BN statistics re-estimated on clean images: which of a model's losses come from
source statistics that do not describe the images it is tested on (RESULTS.md, "What exact
domain statistics say").

Every BN layer forgets its running statistics and averages those of the batches of ``--rows``
of the .npz's images (uncorrupted), as ``nn.BatchNorm2d`` does with ``momentum=None``: the mean
of the batches' means and of their unbiased variances. Nothing else changes. The MLPerf-Tiny
ResNet-8 on the even rows of the CIFAR-10 JPEG test images (the half the models of
``dev_architectures.py`` are trained on; they are tested on the odd rows):

    PYTHONPATH=src python benchmarks/refresh_statistics.py \\
        ../shared/data/resnet8-mlperf-cifar10.pt ../shared/data/cifar10-test-jpeg.npz \\
        --rows even --out ../dev-models/resnet8-refreshed.pt
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn

from dyntta.data.datasets import load_npz
from dyntta.models.checkpoint import load_checkpoint, save_checkpoint

ROWS = {"even": slice(0, None, 2), "odd": slice(1, None, 2), "all": slice(None)}
BATCH = 100


def refresh(model: nn.Module, images: np.ndarray, batch_size: int = BATCH) -> nn.Module:
    """``model`` (in place, returned in eval mode) with every BN layer's running statistics
    averaged over the batches of ``images`` ((N, H, W, 3) uint8), each of ``batch_size``."""
    layers = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    momenta = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches
    model.train()
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            x = torch.from_numpy(images[start : start + batch_size]).permute(0, 3, 1, 2)
            model(x.float() / 255)
    for m, momentum in zip(layers, momenta):
        m.momentum = momentum
    return model.eval()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="the model (as dyntta bench --checkpoint reads it)")
    parser.add_argument("npz", help="clean images: x uint8 (N, H, W, 3), y")
    parser.add_argument("--rows", choices=list(ROWS), default="all")
    parser.add_argument("--out", required=True, help="the checkpoint to write")
    args = parser.parse_args(argv)
    model = load_checkpoint(args.checkpoint)
    images, _ = load_npz(args.npz, "clean images")
    refresh(model, images[ROWS[args.rows]])
    save_checkpoint(model, args.out)
    print(f"{args.out}: BN statistics of {len(images[ROWS[args.rows]])} images ({args.rows} rows)")


if __name__ == "__main__":
    main()
