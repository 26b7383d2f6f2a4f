"""How often a sample's neighbours share its corruption: chosen by the images' spectra, by the
first BN layer's instance means, or as ``dyn_adaptive``'s neighbourhood layers choose them (the
most similar instance means among the images whose spectra are nearest).

For every batch of the streams (15 corruptions at severity 5), each sample's ``n`` neighbours
in the pool the neighbourhood layers search (the batch and the samples before it, the last
``max(256, B)``), itself left out of the share. The instance means are those of the source
model's first BN layer to run; the spectra are :func:`~dyntta.norm.spectrum.log_band_power`.

    PYTHONPATH=src python benchmarks/neighbour_domains.py --data-dir ../shared/data
    PYTHONPATH=src python benchmarks/neighbour_domains.py --data-dir ../shared/data \\
        --checkpoint resnet8-mlperf-cifar10.pt
    PYTHONPATH=src python benchmarks/neighbour_domains.py --dataset digits
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from dyntta.bench.config import DatasetEntry
from dyntta.bench.sources import SourceOptions, resolve_source
from dyntta.data import make_stream
from dyntta.norm.neighbours import nearest_neighbours
from dyntta.norm.spectrum import MIN_IMAGES, log_band_power, nearest_spectra

RULES = ("spectra", "instance means", "dyn_adaptive")


def shares(signatures: torch.Tensor, features: torch.Tensor, domains: torch.Tensor,
           queries: int, n: int) -> dict[str, float]:
    """For each of the last ``queries`` rows of the (P, D) ``signatures``, (P, C) ``features``
    and (P,) ``domains``: the share of its ``n`` neighbours, itself left out, in its domain,
    by each rule of :data:`RULES` (averaged over the queries)."""
    by_spectra = nearest_spectra(signatures, n, queries)
    by_features = nearest_neighbours(features, n, queries)
    both = nearest_neighbours(features, n, queries, nearest_spectra(signatures, MIN_IMAGES,
                                                                    queries))
    own = domains[-queries:, None]
    return {rule: float((domains[index[:, 1:]] == own).double().mean())
            for rule, index in zip(RULES, (by_spectra, by_features, both))}


def first_bn_means(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, C) instance means of the input of the first BatchNorm2d that runs on ``x``."""
    seen: list[torch.Tensor] = []
    hooks = [m.register_forward_pre_hook(lambda m, a: seen.append(a[0].mean((2, 3))))
             for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        for hook in hooks:
            hook.remove()
    return seen[0]


def stream_shares(source, scenario: str, batch_size: int, seed: int, n: int, window: int = 256
                  ) -> dict[str, float]:
    """:func:`shares` over every batch of one stream, weighted by the batches' sizes."""
    stream = make_stream(source.dataset, n_domains=15, severity=5, scenario=scenario,
                         batch_size=batch_size, seed=seed, n_samples=100,
                         delta=0.1 if scenario == "wild" else None)
    pool: tuple[torch.Tensor, ...] | None = None  # signatures, features, domains
    totals, count = dict.fromkeys(RULES, 0.0), 0
    for batch in stream:
        new = (log_band_power(batch.x), first_bn_means(source.model, batch.x), batch.domain)
        rows = max(window, len(batch.x))
        pool = new if pool is None else tuple(torch.cat(p)[-rows:] for p in zip(pool, new))
        for rule, share in shares(*pool, len(batch.x), n).items():
            totals[rule] += share * len(batch.x)
        count += len(batch.x)
    return {rule: total / count for rule, total in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--dataset", choices=["npz", "digits"], default="npz",
                        help="npz: the CIFAR-10 JPEG test images with --checkpoint; digits: the "
                        "embedded digits with their ResNet-20")
    parser.add_argument("--checkpoint", default="resnet20-cifar10.th")
    parser.add_argument("--scenarios", nargs="+", default=["crossmix", "random"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 16])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--neighbours", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    entry = DatasetEntry("digits") if args.dataset == "digits" else \
        DatasetEntry("npz", "cifar10-test-jpeg.npz", args.checkpoint)
    source = resolve_source(entry, SourceOptions(args.data_dir, args.cache_dir, severities=(5,)),
                            progress=False)
    print(f"{entry.checkpoint or entry.name}: share of each sample's {args.neighbours} "
          f"neighbours (itself left out) in its corruption, seeds {args.seeds}")
    print("| scenario | B | " + " | ".join(RULES) + " |")
    print("|---|---:|" + "---:|" * len(RULES))
    for scenario in args.scenarios:
        for b in args.batch_sizes:
            runs = [stream_shares(source, scenario, b, seed, args.neighbours)
                    for seed in args.seeds]
            means = [sum(r[rule] for r in runs) / len(runs) for rule in RULES]
            print(f"| {scenario} | {b} | " + " | ".join(f"{100 * m:.1f}%" for m in means) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
