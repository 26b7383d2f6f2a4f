"""How far BN inputs sit from zero relative to their spread: per BN layer of the real CIFAR-10
ResNet-20, the median, 99th percentile and maximum over samples and channels of
|instance mean| / instance std (what bounds the one-pass variance's rounding error, see
``dyntta.norm.instance_stats``).

    python benchmarks/bn_input_ratios.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import dyntta
from dyntta.data.datasets import to_tensor
from dyntta.data import load_npz


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--n-images", type=int, default=256, help="first N test images")
    args = parser.parse_args()
    data_dir = Path(args.data_dir)
    images, _ = load_npz(data_dir / "cifar10-test-jpeg.npz", "CIFAR-10 test set")
    model = dyntta.models.load_checkpoint(data_dir / "resnet20-cifar10.th")
    rows = []

    def record(name: str, x: torch.Tensor) -> None:
        var, mean = torch.var_mean(x.double(), dim=(2, 3))
        ratio = (mean.abs() / var.sqrt().clamp_min(1e-12)).flatten()
        rows.append((name, ratio.median(), ratio.quantile(0.99), ratio.max()))

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.register_forward_hook(lambda m, inputs, out, name=name: record(name, inputs[0]))
    with torch.inference_mode():
        model(to_tensor(images[: args.n_images]))
    print(f"|mean| / std of BN inputs, ResNet-20, first {args.n_images} CIFAR-10 test images")
    print("| BN layer | median | 99th percentile | max |\n|---|---:|---:|---:|")
    for name, median, q99, top in rows:
        print(f"| {name} | {median:.2f} | {q99:.2f} | {top:.2f} |")


if __name__ == "__main__":
    main()
