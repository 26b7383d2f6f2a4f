"""How far the spectral signatures of a batch spread when it is one domain and when it mixes
domains: the reading behind :mod:`dyntta.norm.spectrum`'s constants. No model runs.

For every full batch of the streams (15 corruptions at severity 5, Wild with label shift 0.1),
the :func:`~dyntta.norm.spectrum.signature_spread` of its images' signatures, split by whether
they come from one domain; the table gives quantiles of each and how many batches
``one_domain``'s threshold misjudges.

    PYTHONPATH=src python benchmarks/one_domain_spread.py --data-dir ../shared/data
    PYTHONPATH=src python benchmarks/one_domain_spread.py --dataset digits
"""

from __future__ import annotations

import argparse

import torch

from dyntta.bench.config import DatasetEntry
from dyntta.bench.sources import SourceOptions, corrupted_images
from dyntta.data import make_stream
from dyntta.norm.spectrum import log_band_power, signature_spread, spread_threshold

QUANTILES = (0.0, 0.05, 0.5, 0.95, 1.0)


def spreads(dataset, scenarios, batch_size: int, seeds, n_samples: int | None,
            n_domains: int = 15) -> tuple[list[float], list[float]]:
    """The spreads of the full batches from one domain and of those that mix domains, over the
    streams of ``dataset``'s first ``n_domains`` corruptions at severity 5."""
    one, mixed = [], []
    for scenario in scenarios:
        for seed in seeds:
            stream = make_stream(dataset, n_domains=n_domains, severity=5, scenario=scenario,
                                 batch_size=batch_size, seed=seed, n_samples=n_samples,
                                 delta=0.1 if scenario == "wild" else None)
            for batch in stream:
                if len(batch.x) == batch_size:
                    spread = float(signature_spread(log_band_power(batch.x)))
                    (one if len(batch.domain.unique()) == 1 else mixed).append(spread)
    return one, mixed


def summary(values: list[float]) -> str:
    q = torch.tensor(values).quantile(torch.tensor(QUANTILES))
    return " / ".join(f"{float(v):.2f}" for v in q)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--dataset", choices=["npz", "digits"], default="npz")
    parser.add_argument("--path", default="cifar10-test-jpeg.npz", help="the npz dataset's file")
    parser.add_argument("--scenarios", nargs="+",
                        default=["continual", "crossmix", "random", "wild"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 32, 16])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--n-samples", type=int, default=100, help="rows per domain")
    args = parser.parse_args()
    entry = DatasetEntry(args.dataset, args.path if args.dataset == "npz" else None)
    dataset, _ = corrupted_images(entry, SourceOptions(args.data_dir, args.cache_dir,
                                                       severities=(5,)))
    where = args.path if args.dataset == "npz" else ""
    print(f"{args.dataset} {where}: spread of the batches' signatures (nats), "
          "min / 5% / median / 95% / max; misjudged at the threshold of B images")
    print("| B | threshold | one domain | batches | judged mixed | mixed domains | batches | "
          "judged one |")
    print("|---:|---:|---|---:|---:|---|---:|---:|")
    for b in args.batch_sizes:
        one, mixed = spreads(dataset, args.scenarios, b, args.seeds, args.n_samples)
        threshold = spread_threshold(b)
        wrong_one = 100 * sum(s >= threshold for s in one) / len(one)
        wrong_mixed = 100 * sum(s < threshold for s in mixed) / len(mixed)
        print(f"| {b} | {threshold} | {summary(one)} | {len(one)} | {wrong_one:.1f}% | "
              f"{summary(mixed)} | {len(mixed)} | {wrong_mixed:.1f}% |", flush=True)


if __name__ == "__main__":
    main()
