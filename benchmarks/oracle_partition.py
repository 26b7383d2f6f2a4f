"""How much a perfect partition would give: DYN's cluster-aware layer with the stream's true
domains as its clusters (an oracle no test-time method has), against ``dyn``, ``dyn_adaptive``
and ``tbn`` on the same streams, with paired 95% intervals.

Labels:

- ``dyn``, ``dyn_adaptive``, ``tbn``: the registered methods;
- ``dyn+domains``: DYN's layer (source weight 0.8, every layer) clustering by true domain;
  ``dyn+domains@A``: the same at source weight A (``--alphas``), which measures the source
  weight a model wants once its test statistics are exact;
- ``deep+domains``: ``dyn_adaptive`` with a perfect :class:`~dyntta.norm.WindowMatch`: its
  pooling layers keep the remembered samples whose true domain is one of the batch's.

``--agreement N`` adds a label-free reading of the same weights (:func:`synthetic_agreement`):
on the stream's first N images, how often DYN's layer at each weight, given synthetic domains as
clusters, predicts on a batch shifted by those domains what it predicts on the batch as it came
(a random fifth of each batch of :data:`BATCH` shifted by each of :data:`SYNTHETIC`, including
no shift, :data:`DRAWS` draws). With exact domain statistics the best source weight differs
between models and no statistic of the features tells them apart (docs/dyn-adaptive-rules.md,
"What exact domain statistics say"); this reads the network's response instead. Tried as a rule
of ``dyn_adaptive`` and not kept (the same page, "How far to trust the source, read from the
model").

``--scenarios clean`` runs the labels on the npz file's images uncorrupted, each once, shuffled
by the seed: whether the model's source statistics describe its test images at all (RESULTS.md,
"The ResNet-8's source statistics do not describe its test images").

    PYTHONPATH=src python benchmarks/oracle_partition.py --data-dir ../shared/data --cache-dir CACHE \
        --dataset npz --scenarios crossmix continual --batch-sizes 64 16 --seeds 0 1 2
    PYTHONPATH=src python benchmarks/oracle_partition.py --data-dir ../shared/data \
        --checkpoint resnet8-mlperf-cifar10.pt --labels tbn dyn+domains --alphas 0 0.33 0.67 0.8
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import dyntta
from dyntta.bench.config import DatasetEntry
from dyntta.bench.sources import SourceOptions, resolve_path, resolve_source
from dyntta.bench.stats import difference_interval
from dyntta.data import make_stream
from dyntta.data.datasets import load_npz, to_tensor
from dyntta.data.streams import Batch
from dyntta.methods.dyn import DYNConfig
from dyntta.norm import ClusterAwareBatchNorm2d, WindowMatch, replace_batchnorm

DATASETS = {
    "npz": DatasetEntry("npz", "cifar10-test-jpeg.npz", "resnet20-cifar10.th"),
    "digits": DatasetEntry("digits"),
}


class TrueDomains:
    """A clustering for :class:`ClusterAwareBatchNorm2d` that returns the current batch's true
    domains."""

    def show(self, domains: torch.Tensor) -> None:
        """The next batch's domains (call before its forward)."""
        self.current = domains

    def __call__(self, mu: torch.Tensor) -> torch.Tensor:
        return self.current


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


def oracle_model(model, domains: TrueDomains, alpha: float):
    model = copy.deepcopy(model)
    replace_batchnorm(model, lambda bn: ClusterAwareBatchNorm2d(bn, alpha, clustering=domains))
    return model.eval().requires_grad_(False)


def deep_oracle_model(model, options: dict | None = None) -> tuple[nn.Module, TrueDomainMatch]:
    adapter = dyntta.adapt(model, "dyn_adaptive", **(options or {}))
    # before the first batch gives the layers their roles: the method (its spectral test reads
    # the signatures the filter remembers) and the class balance take the oracle in place of
    # the method's WindowMatch
    domains = TrueDomainMatch(adapter._match.memory)
    adapter._match = adapter._balance.within = domains
    return adapter, domains


LABELS = ["dyn", "dyn_adaptive", "tbn", "dyn+domains", "deep+domains"]


def comparisons(labels: list[str]) -> list[tuple[str, str]]:
    """Each oracle beside the method it improves on (the tables' difference columns): the
    domain oracles beside DYN, or beside TBN without DYN; ``deep+domains`` beside
    ``dyn_adaptive``."""
    pairs = []
    for label in labels:
        if label.startswith("dyn+domains"):
            reference = "dyn" if "dyn" in labels else "tbn"
            pairs.append((label, reference))
        elif label == "deep+domains":
            pairs.append((label, "dyn_adaptive"))
    return [(a, b) for a, b in pairs if b in labels]


def build(label: str, model, options: dict | None = None):
    """The model of ``label`` and the oracle it must be shown each batch's domains (or None);
    ``options``: ``dyn_adaptive``'s, for it and ``deep+domains``."""
    if label.startswith("dyn+domains"):
        domains = TrueDomains()
        _, _, alpha = label.partition("@")
        return oracle_model(model, domains, float(alpha) if alpha else DYNConfig.alpha), domains
    if label == "deep+domains":
        return deep_oracle_model(model, options)
    return dyntta.adapt(model, label, **((options or {}) if label == "dyn_adaptive" else {})), None


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


SYNTHETIC = ("none", "noise", "blur", "contrast", "brightness")
BATCH = 64
"""Images per synthetic batch: about 13 per synthetic domain."""
DRAWS = 4
"""Synthetic shifts drawn for each synthetic batch."""


def synthetic_shift(x: torch.Tensor, kind: torch.Tensor, generator: torch.Generator
                    ) -> torch.Tensor:
    """Each image ``x[i]`` ((B, 3, H, W) in [0, 1]) under ``SYNTHETIC[kind[i]]``: unchanged,
    Gaussian noise of std 0.1, a 3x3 box blur (edges replicated), contrast 0.4 about the image's
    mean, brightness + 0.3; clipped to [0, 1]. Milder than, and drawn per image unlike,
    :func:`dyntta.methods.source_weights.synthetic_shift` (one shift per share of the images):
    the readings of docs/dyn-adaptive-rules.md, "How far to trust the source, read from the
    model", were made with these."""
    mean = x.mean((1, 2, 3), keepdim=True)
    noise = torch.randn(x.shape, generator=generator).to(x.device)
    shifted = torch.stack([
        x,
        x + 0.1 * noise,
        F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, 1),
        (x - mean) * 0.4 + mean,
        x + 0.3,
    ])
    return shifted[kind, torch.arange(len(x), device=x.device)].clamp(0, 1)


def synthetic_agreement(model, images: torch.Tensor, alphas: list[float], seed: int = 0
                        ) -> torch.Tensor:
    """(len(alphas),) the share of (image, draw) pairs that DYN's layer at each source weight,
    the synthetic domains as its clusters, predicts alike with and without a synthetic shift, on
    the whole batches of :data:`BATCH` in ``images`` (B, 3, H, W) in [0, 1]: in each batch and
    each of :data:`DRAWS` draws, a random fifth of the images per kind of :data:`SYNTHETIC`. The
    reference is the layer's prediction on the unshifted batch as one cluster."""
    domains = TrueDomains()
    net = oracle_model(model, domains, DYNConfig.alpha)
    layers = [m for m in net.modules() if isinstance(m, ClusterAwareBatchNorm2d)]
    generator = torch.Generator().manual_seed(seed)
    batches = images[: len(images) - len(images) % BATCH].split(BATCH)
    alike = torch.zeros(len(alphas), dtype=torch.float64)
    with torch.no_grad():
        for x in batches:
            kinds = [torch.randperm(len(x), generator=generator).to(x.device) % len(SYNTHETIC)
                     for _ in range(DRAWS)]
            shifted = [synthetic_shift(x, kind, generator) for kind in kinds]
            for i, alpha in enumerate(alphas):
                for layer in layers:
                    layer.alpha = alpha
                domains.show(torch.zeros_like(kinds[0]))
                reference = net(x).argmax(1)
                for kind, batch in zip(kinds, shifted):
                    domains.show(kind)
                    alike[i] += int((net(batch).argmax(1) == reference).sum())
    return alike / (len(batches) * BATCH * DRAWS)


def stream_of(source, scenario: str, batch_size: int, seed: int, n_samples: int,
              clean: tuple[np.ndarray, np.ndarray] | None = None):
    """The script's stream: 15 domains at severity 5, Wild with label shift delta 0.1;
    ``clean``: the ``clean`` images uncorrupted (:func:`clean_stream`)."""
    if scenario == "clean":
        return clean_stream(clean, batch_size, seed)
    return make_stream(source.dataset, n_domains=15, severity=5, scenario=scenario,
                       batch_size=batch_size, seed=seed, n_samples=n_samples,
                       delta=0.1 if scenario == "wild" else None)


def clean_stream(images: tuple[np.ndarray, np.ndarray], batch_size: int, seed: int
                 ) -> list[Batch]:
    """Every one of the uncorrupted ``(x, y)`` images (as in an .npz, (N, H, W, 3) uint8) once,
    in an order drawn from ``seed``, in batches of ``batch_size``: one domain."""
    x, y = images
    order = np.random.default_rng(seed).permutation(len(y))
    return [Batch(to_tensor(x[rows]), torch.from_numpy(y[rows]).long(),
                  torch.zeros(len(rows), dtype=torch.long))
            for rows in np.array_split(order, range(batch_size, len(order), batch_size))]


def first_images(stream, n: int) -> torch.Tensor:
    """The first ``n`` images of ``stream``, in its order."""
    batches, seen = [], 0
    for batch in stream:
        batches.append(batch.x)
        seen += len(batch.x)
        if seen >= n:
            break
    return torch.cat(batches)[:n]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--dataset", choices=list(DATASETS), default="npz")
    parser.add_argument("--scenarios", nargs="+", default=["crossmix", "continual"],
                        help="stream scenarios, or clean: the npz file's uncorrupted images, "
                        "each once, shuffled")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 16])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--n-samples", type=int, default=100, help="rows per domain")
    parser.add_argument("--labels", nargs="+", choices=LABELS, default=LABELS)
    parser.add_argument("--alphas", nargs="+", type=float,
                        help="source weights of dyn+domains (one column each; default 0.8)")
    parser.add_argument("--checkpoint", help="the source model's checkpoint, in place of the "
                        "dataset's (for npz: resnet20-cifar10.th)")
    parser.add_argument("--model", help="the model's factory, package.module:function "
                        "(as dyntta bench --model)")
    parser.add_argument("--path", help="the dataset's file, in place of the dataset's (for npz: "
                        "cifar10-test-jpeg.npz)")
    parser.add_argument("--agreement", type=int, metavar="N", default=0,
                        help="also print the synthetic agreement at each source weight on the "
                        "first N images of each stream (B = 64)")
    parser.add_argument("--options", type=json.loads, default={}, metavar="JSON",
                        help="dyn_adaptive's options, for it and deep+domains, e.g. "
                        "'{\"prior_strength\": 4, \"balanced_alpha\": 0}'")
    args = parser.parse_args(argv)
    if not isinstance(args.options, dict):
        parser.error(f"--options takes a JSON object, got {args.options!r}")
    if args.agreement and args.agreement < BATCH:
        parser.error(f"--agreement reads whole batches of {BATCH} images, got {args.agreement}")
    entry = DATASETS[args.dataset]
    for field in ("checkpoint", "model", "path"):
        if getattr(args, field):
            entry = dataclasses.replace(entry, **{field: getattr(args, field)})
    if "clean" in args.scenarios and entry.name != "npz":
        parser.error("--scenarios clean reads the uncorrupted images of an npz file")
    options = SourceOptions(args.data_dir, args.cache_dir, severities=(5,))
    source = resolve_source(entry, options, False)
    clean = load_npz(resolve_path(entry.path, options)) if "clean" in args.scenarios else None
    labels = [label for label in LABELS if label in args.labels]
    if args.alphas and "dyn+domains" in labels:
        at = labels.index("dyn+domains")
        labels[at : at + 1] = [f"dyn+domains@{alpha:g}" for alpha in args.alphas]
    pairs = comparisons(labels)
    name = args.model or args.checkpoint or args.dataset
    print("| model | scenario | B | seeds | " + " | ".join(labels)
          + "".join(f" | {a} - {b}" for a, b in pairs)
          + " |\n|" + "---|" * (len(labels) + len(pairs) + 4))
    for scenario in args.scenarios:
        for b in args.batch_sizes:
            runs = {label: ([], []) for label in labels}
            for seed in args.seeds:
                stream = stream_of(source, scenario, b, seed, args.n_samples, clean)
                for label in labels:
                    model, domains = build(label, source.model, args.options)
                    hits, sizes = run(model, stream, domains)
                    runs[label][0].append(hits)
                    runs[label][1].append(sizes)
            acc = {k: 100 * sum(map(sum, h)) / sum(map(sum, n)) for k, (h, n) in runs.items()}
            cells = [f"{acc[k]:.1f}" for k in labels]
            for a, ref in pairs:
                low, high = difference_interval(runs[a], runs[ref])
                cells.append(f"{acc[a] - acc[ref]:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]")
            print(f"| {name} | {scenario} | {b} | {len(args.seeds)} | "
                  + " | ".join(cells) + " |", flush=True)
    if args.agreement:
        print_agreement(source, args, name, clean)


def print_agreement(source, args, name: str, clean) -> None:
    """The table of :func:`synthetic_agreement` (%) at ``--alphas`` per scenario, the mean over
    the seeds' streams, the highest in bold."""
    alphas = args.alphas or [DYNConfig.alpha]
    print("\n| model | scenario | seeds | " + " | ".join(f"w = {a:.2g}" for a in alphas)
          + " |\n|" + "---|" * (len(alphas) + 3))
    for scenario in args.scenarios:
        agreement = torch.zeros(len(alphas))
        for seed in args.seeds:
            stream = stream_of(source, scenario, BATCH, seed, args.n_samples, clean)
            images = first_images(stream, args.agreement)
            agreement += synthetic_agreement(source.model, images, alphas) / len(args.seeds)
        best = int(agreement.argmax())
        cells = [f"**{100 * v:.1f}**" if i == best else f"{100 * v:.1f}"
                 for i, v in enumerate(agreement.tolist())]
        print(f"| {name} | {scenario} | {len(args.seeds)} | " + " | ".join(cells) + " |",
              flush=True)


if __name__ == "__main__":
    main()
