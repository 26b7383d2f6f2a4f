"""How much a perfect partition would give: DYN's cluster-aware layer with the stream's true
domains as its clusters (an oracle no test-time method has), against ``dyn`` and ``dyn_adaptive``
on the same streams, with paired 95% intervals.

Labels:

- ``dyn``, ``dyn_adaptive``: the registered methods;
- ``dyn+domains``: DYN's layer (source weight 0.8, every layer) clustering by true domain;
- ``size+window+domains``: every layer clusters by true domain over the batch and a window of the
  last 64 samples, source weight ``16 / (16 + n_k)``: the oracle's best measured combination;
- ``deep256+match``: ``dyn_adaptive`` with a 256-sample deep window kept to the current domain
  by :class:`~dyntta.norm.WindowMatch` (``deep_window=256, deep_match=0.1``);
- ``deep256+domains``: the same with a perfect filter: the deep layers keep the remembered
  samples whose true domain is one of the batch's.

    PYTHONPATH=src python benchmarks/oracle_partition.py --data-dir ../shared/data --cache-dir CACHE \
        --dataset npz --scenarios crossmix continual --batch-sizes 64 16 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import copy

import torch

import dyntta
from dyntta.bench.config import DatasetEntry
from dyntta.bench.sources import SourceOptions, resolve_source
from dyntta.bench.stats import difference_interval
from dyntta.data import make_stream
from dyntta.norm import ClusterAwareBatchNorm2d, WindowMatch, replace_batchnorm

DATASETS = {
    "npz": DatasetEntry("npz", "cifar10-test-jpeg.npz", "resnet20-cifar10.th"),
    "digits": DatasetEntry("digits"),
}
WINDOW = 64


class TrueDomains:
    """A clustering for :class:`ClusterAwareBatchNorm2d` that returns the samples' true domains:
    those of the current batch, preceded (when the layer clusters a window with the batch) by
    those of the most recent earlier samples."""

    def __init__(self) -> None:
        self.past = torch.zeros(0, dtype=torch.long)
        self.current = self.past

    def show(self, domains: torch.Tensor) -> None:
        """The next batch's domains (call before its forward)."""
        self.past = torch.cat([self.past, self.current])[-WINDOW:]
        self.current = domains

    def __call__(self, mu: torch.Tensor) -> torch.Tensor:
        extra = mu.shape[0] - self.current.shape[0]
        return torch.cat([self.past[len(self.past) - extra:], self.current]) if extra else self.current


class TrueDomainMatch(WindowMatch):
    """:class:`WindowMatch`'s oracle: keeps the remembered samples whose true domain is one of
    the current batch's."""

    def __init__(self, memory: int) -> None:
        super().__init__(memory, pool=0, quantile=0.0)

    def reset(self) -> None:
        super().reset()
        self.domains = torch.zeros(0, dtype=torch.long)

    def show(self, domains: torch.Tensor) -> None:
        """The next batch's domains (call before its forward)."""
        self.domains = torch.cat([self.domains, domains])[-(self.memory + len(domains)):]

    def judge(self, n_window: int, batch_size: int) -> torch.Tensor:
        seen = len(self.domains) - batch_size
        return torch.isin(self.domains[seen - n_window : seen], self.domains[seen:])


DEEP = {"deep_window": 256, "deep_match": 0.1}


def oracle_model(model, domains: TrueDomains, **options):
    model = copy.deepcopy(model)
    replace_batchnorm(model, lambda bn: ClusterAwareBatchNorm2d(bn, clustering=domains, **options))
    return model.eval().requires_grad_(False)


def deep_oracle_model(model, domains: TrueDomainMatch):
    adapter = dyntta.adapt(model, "dyn_adaptive", **DEEP)
    # the observing layer stays: its observe() starts each batch's decisions afresh
    for layer in adapter.modules():
        if isinstance(layer, ClusterAwareBatchNorm2d):
            layer.signature = domains if layer.signature is not None else None
            layer.match = domains if layer.match is not None else None
    return adapter


ORACLES = {
    "dyn+domains": {},
    "size+window+domains": {"source_weight": "size", "window": WINDOW},
}
# each oracle (or option) beside the method it improves on: the tables' difference columns
COMPARISONS = [("size+window+domains", "dyn"), ("deep256+match", "dyn_adaptive"),
               ("deep256+domains", "dyn_adaptive")]
LABELS = ["dyn", "dyn_adaptive", *ORACLES, "deep256+match", "deep256+domains"]


def build(label: str, model):
    """The model of ``label`` and the oracle it must be shown each batch's domains (or None)."""
    if label in ORACLES:
        domains = TrueDomains()
        return oracle_model(model, domains, **ORACLES[label]), domains
    if label == "deep256+domains":
        domains = TrueDomainMatch(DEEP["deep_window"])
        return deep_oracle_model(model, domains), domains
    if label == "deep256+match":
        return dyntta.adapt(model, "dyn_adaptive", **DEEP), None
    return dyntta.adapt(model, label), None


def run(model, stream, domains) -> tuple[list[int], list[int]]:
    """Hits and sizes of every batch, each predicted before the next is seen."""
    hits, sizes = [], []
    with torch.no_grad():
        for batch in stream:
            if domains is not None:
                domains.show(batch.domain)
            hits.append(int((model(batch.x).argmax(1) == batch.y).sum()))
            sizes.append(len(batch.y))
    return hits, sizes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--dataset", choices=list(DATASETS), default="npz")
    parser.add_argument("--scenarios", nargs="+", default=["crossmix", "continual"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 16])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--n-samples", type=int, default=100, help="rows per domain")
    parser.add_argument("--labels", nargs="+", choices=LABELS, default=LABELS)
    args = parser.parse_args(argv)
    source = resolve_source(DATASETS[args.dataset],
                            SourceOptions(args.data_dir, args.cache_dir, severities=(5,)), False)
    labels = [label for label in LABELS if label in args.labels]
    pairs = [(a, b) for a, b in COMPARISONS if a in labels and b in labels]
    print("| dataset | scenario | B | seeds | " + " | ".join(labels)
          + "".join(f" | {a} - {b}" for a, b in pairs)
          + " |\n|" + "---|" * (len(labels) + len(pairs) + 4))
    for scenario in args.scenarios:
        for b in args.batch_sizes:
            runs = {label: ([], []) for label in labels}
            for seed in args.seeds:
                stream = make_stream(source.dataset, n_domains=15, severity=5, scenario=scenario,
                                     batch_size=b, seed=seed, n_samples=args.n_samples,
                                     delta=0.1 if scenario == "wild" else None)
                for label in labels:
                    model, domains = build(label, source.model)
                    hits, sizes = run(model, stream, domains)
                    runs[label][0].append(hits)
                    runs[label][1].append(sizes)
            acc = {k: 100 * sum(map(sum, h)) / sum(map(sum, n)) for k, (h, n) in runs.items()}
            cells = [f"{acc[k]:.1f}" for k in labels]
            for a, ref in pairs:
                low, high = difference_interval(runs[a], runs[ref])
                cells.append(f"{acc[a] - acc[ref]:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]")
            print(f"| {args.dataset} | {scenario} | {b} | {len(args.seeds)} | "
                  + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
