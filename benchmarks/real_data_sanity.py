"""Sanity check on real data: source, TBN, alpha-BN and DYN with the real CIFAR-10 ResNet-20.

    python benchmarks/real_data_sanity.py --data-dir ../shared/data

Streams (batches of 64, shuffled with a fixed seed) over the JPEG round-tripped CIFAR-10 test set
(all 10,000 images, or ``--n-images`` of them): ``clean`` (the clean images), ``noise`` (the same
images with Gaussian noise, CIFAR-10-C severity 5) and ``clean+noise`` (both pooled and shuffled,
so every batch mixes the two domains).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

import dyntta
from dyntta.data.datasets import to_tensor
from dyntta.data import corrupt, load_npz

METHODS = ("source", "tbn", "alpha_bn", "dyn")


def stream_accuracy(method, images: np.ndarray, labels: np.ndarray, order: np.ndarray,
                    batch: int) -> float:
    correct = 0
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        correct += int((method(to_tensor(images[idx])).argmax(1).numpy() == labels[idx]).sum())
    return correct / len(order)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-images", type=int, default=10_000, help="test images used (random)")
    args = parser.parse_args()
    data_dir = Path(args.data_dir)
    images, all_labels = load_npz(data_dir / "cifar10-test-jpeg.npz", "CIFAR-10 test set")
    keep = np.sort(np.random.default_rng(args.seed).permutation(len(all_labels))[: args.n_images])
    clean, labels = images[keep], all_labels[keep]
    noisy = corrupt(clean, "gaussian_noise", 5, seed=args.seed)
    model = dyntta.models.load_checkpoint(data_dir / "resnet20-cifar10.th")
    rng = np.random.default_rng(args.seed)
    n = len(clean)
    both = np.concatenate([clean, noisy])
    both_labels = np.concatenate([labels, labels])
    streams = {
        "clean": (clean, labels, rng.permutation(n)),
        "noise": (noisy, labels, rng.permutation(n)),
        "clean+noise": (both, both_labels, rng.permutation(2 * n)),
    }
    print(f"accuracy (%), {len(clean)} images, batch size {args.batch_size}, seed {args.seed}")
    print("| method | " + " | ".join(streams) + " |")
    print("|---|" + "---:|" * len(streams))
    with torch.inference_mode():
        for name in METHODS:
            accs = [
                100 * stream_accuracy(dyntta.adapt(model, name), x, y, order, args.batch_size)
                for x, y, order in streams.values()
            ]
            print(f"| {name} | " + " | ".join(f"{a:.1f}" for a in accs) + " |", flush=True)


if __name__ == "__main__":
    main()
