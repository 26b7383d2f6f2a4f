"""Cost of one BN replacement layer and of the instance statistics, per (B, C, H, W) input.

    python benchmarks/norm_layer_overhead.py

Times the source, TBN and DYN (CABN) layers on their own, interleaved in one process (each
repeat runs every candidate once, in turn), and the instance mean/variance as
``dyntta.norm.instance_stats`` computes it against the two-pass ``E[(x - mean)^2]``, and
``dyntta.norm.normalize`` with per-sample (B, C) statistics: the broadcast multiply and add (DYN)
against the fused kernel on the batch folded into the channels (``fused=True``), and with one
(C,) row for the whole batch (the fused kernel on the batch itself: ``dyn_adaptive`` on a batch of
one domain). Prints the median microseconds per call and DYN's overhead over TBN. Run it against
another checkout with ``PYTHONPATH=<checkout>/src`` to compare versions.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dyntta.norm import (
    ClusterAwareBatchNorm2d,
    SourceBatchNorm2d,
    TestBatchNorm2d,
    instance_stats,
    normalize,
)

SHAPES = ((64, 16, 32, 32), (64, 32, 16, 16), (64, 64, 8, 8), (16, 64, 8, 8), (256, 16, 32, 32))


def two_pass_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = x.mean(dim=(2, 3))
    return mean, (x - mean[:, :, None, None]).square().mean(dim=(2, 3))


def median_us(candidates: dict, x: torch.Tensor, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in candidates}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, run in candidates.items():
                start = time.perf_counter()
                run(x)
                times[name].append(time.perf_counter() - start)
    return {name: 1e6 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, wall clock, "
          f"median of {args.repeats}")
    print("| B, C, H, W | source us | tbn us | dyn us | dyn - tbn us | instance_stats us | "
          "two-pass us | per-sample scale us | folded us | one row us |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for shape in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(shape)
        bn = torch.nn.BatchNorm2d(shape[1]).eval()
        mean, var = instance_stats(x)
        w, b = bn.weight.detach(), bn.bias.detach()
        med = median_us({"source": SourceBatchNorm2d(bn), "tbn": TestBatchNorm2d(bn),
                         "dyn": ClusterAwareBatchNorm2d(bn), "stats": instance_stats,
                         "two_pass": two_pass_stats,
                         "scale": lambda x: normalize(x, mean, var, w, b, bn.eps),
                         "folded": lambda x: normalize(x, mean, var, w, b, bn.eps, fused=True),
                         "row": lambda x: normalize(x, mean[0], var[0], w, b, bn.eps)},
                        x, args.repeats)
        print(f"| {', '.join(map(str, shape))} | {med['source']:.0f} | {med['tbn']:.0f} | "
              f"{med['dyn']:.0f} | {med['dyn'] - med['tbn']:.0f} | {med['stats']:.0f} | "
              f"{med['two_pass']:.0f} | {med['scale']:.0f} | {med['folded']:.0f} | "
              f"{med['row']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
