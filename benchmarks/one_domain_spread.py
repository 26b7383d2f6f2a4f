"""How far the spectral signatures of a batch spread when it is one domain and when it mixes
domains: the reading behind :mod:`dyntta.norm.spectrum`'s constants. No model runs.

For every full batch of the streams (15 corruptions at severity 5, Wild with label shift 0.1),
the :func:`~dyntta.norm.spectrum.signature_spread` of its images' signatures, split by whether
they come from one domain; the table gives quantiles of each and how many batches
``one_domain``'s threshold misjudges. With ``--windows``, for batches of fewer than 32: of the
windows (each batch after the images just before it, 32 in all) that pass the spread test, the
:func:`~dyntta.norm.spectrum.domain_shift` of the batch from those images, split by whether the
32 are truly one domain, and how many fall under ``SAME_DOMAIN_SHIFT``.

    PYTHONPATH=src python benchmarks/one_domain_spread.py --data-dir ../shared/data
    PYTHONPATH=src python benchmarks/one_domain_spread.py --dataset digits
    PYTHONPATH=src python benchmarks/one_domain_spread.py --data-dir ../shared/data --windows \
        --batch-sizes 16 4 --scenarios continual random wild
"""

from __future__ import annotations

import argparse

import torch

from dyntta.bench.config import DatasetEntry
from dyntta.bench.sources import SourceOptions, corrupted_images
from dyntta.data import make_stream
from dyntta.norm.spectrum import (
    MIN_IMAGES, SAME_DOMAIN_SHIFT, domain_shift, log_band_power, one_domain, signature_spread,
    spread_threshold)

QUANTILES = (0.0, 0.05, 0.5, 0.95, 1.0)


def streams(dataset, scenarios, batch_size: int, seeds, n_samples: int | None,
            n_domains: int = 15):
    """Every stream of ``dataset``'s first ``n_domains`` corruptions at severity 5 for these
    scenarios and seeds (Wild with label shift 0.1)."""
    for scenario in scenarios:
        for seed in seeds:
            yield make_stream(dataset, n_domains=n_domains, severity=5, scenario=scenario,
                              batch_size=batch_size, seed=seed, n_samples=n_samples,
                              delta=0.1 if scenario == "wild" else None)


def spreads(dataset, scenarios, batch_size: int, seeds, n_samples: int | None,
            n_domains: int = 15) -> tuple[list[float], list[float]]:
    """The spreads of the full batches from one domain and of those that mix domains, over the
    streams of :func:`streams`."""
    one, mixed = [], []
    for stream in streams(dataset, scenarios, batch_size, seeds, n_samples, n_domains):
        for batch in stream:
            if len(batch.x) == batch_size:
                spread = float(signature_spread(log_band_power(batch.x)))
                (one if len(batch.domain.unique()) == 1 else mixed).append(spread)
    return one, mixed


def window_shifts(dataset, scenarios, batch_size: int, seeds, n_samples: int | None,
                  n_domains: int = 15) -> tuple[list[float], list[float]]:
    """Over the streams of :func:`streams`, for every full batch of fewer than ``MIN_IMAGES``
    whose window (the batch after the images just before it, ``MIN_IMAGES`` in all) passes the
    spread test: the batch's :func:`~dyntta.norm.spectrum.domain_shift` from those images, for
    the windows truly of one domain and for the others."""
    one, mixed = [], []
    for stream in streams(dataset, scenarios, batch_size, seeds, n_samples, n_domains):
        signatures, domains = None, None
        for batch in stream:
            new = log_band_power(batch.x)
            signatures = new if signatures is None else torch.cat([signatures, new])[-MIN_IMAGES:]
            domains = batch.domain if domains is None else \
                torch.cat([domains, batch.domain])[-MIN_IMAGES:]
            window = signatures.shape[0] == MIN_IMAGES and len(batch.x) == batch_size
            if window and one_domain(signatures):
                shift = float(domain_shift(signatures, batch_size))
                (one if len(domains.unique()) == 1 else mixed).append(shift)
    return one, mixed


def summary(values: list[float]) -> str:
    q = torch.tensor(values).quantile(torch.tensor(QUANTILES))
    return " / ".join(f"{float(v):.2f}" for v in q)


def print_window_shifts(dataset, args, where: str) -> None:
    print(f"{args.dataset} {where}: shift of the batch from the {MIN_IMAGES} - B images before it "
          "(squared standard errors), windows that pass the spread test, min / 5% / median / "
          f"95% / max; share under {SAME_DOMAIN_SHIFT}")
    print("| B | one domain | windows | under | two domains or more | windows | under |")
    print("|---:|---|---:|---:|---|---:|---:|")
    for b in (b for b in args.batch_sizes if b < MIN_IMAGES):
        one, mixed = window_shifts(dataset, args.scenarios, b, args.seeds, args.n_samples)
        under = [100 * sum(v < SAME_DOMAIN_SHIFT for v in vs) / max(1, len(vs))
                 for vs in (one, mixed)]
        print(f"| {b} | {summary(one)} | {len(one)} | {under[0]:.1f}% | {summary(mixed)} | "
              f"{len(mixed)} | {under[1]:.1f}% |", flush=True)


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
    parser.add_argument("--windows", action="store_true",
                        help="the batch's shift from the images before it (batches under 32)")
    args = parser.parse_args()
    entry = DatasetEntry(args.dataset, args.path if args.dataset == "npz" else None)
    dataset, _ = corrupted_images(entry, SourceOptions(args.data_dir, args.cache_dir,
                                                       severities=(5,)))
    where = args.path if args.dataset == "npz" else ""
    if args.windows:
        print_window_shifts(dataset, args, where)
        return
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
