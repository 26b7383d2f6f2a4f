"""How many of the remembered images ``dyn_adaptive``'s deep filter keeps on a batch of one
domain are of that domain, and how many of that domain's it keeps.

Every batch of the streams (15 corruptions at severity 5) whose images the method's spectral test
judges one domain (:meth:`~dyntta.methods.dyn_adaptive.DYNAdaptive.read_spectra`) and whose pool
(those images) truly is: of the remembered images its pooling layers would top it up with (the
last ``deep_window - B``), the filter (:class:`~dyntta.norm.WindowMatch`, with its blocks of B,
before the class balance, which reads predictions) keeps some; precision is the share of the kept ones of the
pool's domain, recall the share of the remembered ones of its domain that are kept. It reads the
images' signatures only: no model runs.

    PYTHONPATH=src python benchmarks/deep_filter_domains.py --data-dir ../shared/data --n-samples 200
    PYTHONPATH=src python benchmarks/deep_filter_domains.py --data-dir ../dev-models \\
        --path cifar10-test-half.npz
"""

from __future__ import annotations

import argparse
from typing import Iterable, Iterator

import torch

import dyntta
from dyntta.bench.config import DatasetEntry
from dyntta.bench.sources import SourceOptions, resolve_source
from dyntta.data import make_stream
from dyntta.methods.dyn_adaptive import DYNAdaptive
from dyntta.norm.spectrum import log_band_power


def kept_images(method: DYNAdaptive, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
    """For each (signatures (B, D), domains (B,)) batch in turn whose pool the method judges
    one domain and that truly is: which of the remembered images its filter keeps ((n,) bool),
    their domains ((n,)) and the pool's domain. ``method``: a fresh ``dyn_adaptive`` (only its
    filter and its spectral test run)."""
    c, seen = method.config, torch.zeros(0, dtype=torch.long)
    for signatures, domains in batches:
        b = len(domains)
        method._match.observe(signatures)
        seen = torch.cat([seen, domains])[-(c.deep_window + b):]
        rows, _ = method.read_spectra(b)
        pool = seen[-rows:] if rows else seen[:0]
        if not rows or (pool != pool[0]).any():
            continue
        method.aim_filter(rows, b)
        n_window = min(max(0, c.deep_window - b), len(seen) - b)
        if n_window:
            yield method._match.keep(n_window, b), seen[-b - n_window : -b], int(pool[0])


def purity(kept: Iterable[tuple[torch.Tensor, torch.Tensor, int]]) -> dict[str, float]:
    """Batches, kept images per batch, precision and recall (:func:`kept_images`) over them."""
    batches = held = right = own = 0
    for keep, domains, domain in kept:
        batches += 1
        held += int(keep.sum())
        right += int((keep & (domains == domain)).sum())
        own += int((domains == domain).sum())
    return {"batches": batches, "kept": held / max(batches, 1),
            "precision": right / max(held, 1), "recall": right / max(own, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--path", default="cifar10-test-jpeg.npz", help="the npz test images")
    parser.add_argument("--scenarios", nargs="+", default=["continual", "random", "wild"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 16])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--n-samples", type=int, default=100, help="rows per domain")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # the model only carries the images through resolve_source; it never runs
    entry = DatasetEntry("npz", args.path, "resnet20-cifar10.th")
    source = resolve_source(entry, SourceOptions(args.data_dir, args.cache_dir, severities=(5,)),
                            progress=False)
    print(f"{args.path}, {args.n_samples} rows per domain, seeds {args.seeds}: the remembered "
          "images the deep filter keeps on batches of one domain")
    print("| scenario | B | batches | kept per batch | of its domain (precision) "
          "| its domain's kept (recall) |")
    print("|---|---:|---:|---:|---:|---:|")
    for scenario in args.scenarios:
        for b in args.batch_sizes:
            kept = []
            for seed in args.seeds:
                stream = make_stream(source.dataset, n_domains=15, severity=5, scenario=scenario,
                                     batch_size=b, seed=seed, n_samples=args.n_samples,
                                     delta=0.1 if scenario == "wild" else None)
                method = dyntta.adapt(dyntta.models.build("resnet20").eval(), "dyn_adaptive")
                kept += kept_images(method, ((log_band_power(batch.x), batch.domain)
                                             for batch in stream))
            p = purity(kept)
            print(f"| {scenario} | {b} | {p['batches']} | {p['kept']:.1f} | "
                  f"{100 * p['precision']:.0f}% | {100 * p['recall']:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
