"""``dyntta analyze <name>``: run one of the paper's analyses, write its results and figure.

Every analysis writes ``<out>/<name>.jsonl`` (JSON lines, atomically) and then draws
``<out>/<name>.png`` from that file; ``--plot-only`` redraws the figure from an existing file.
The data and model options are those of ``dyntta bench`` (default: the embedded digits set).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Callable

import torch

from dyntta.analysis import (
    alpha_sweep,
    clustering_ablation,
    clusters_per_layer,
    patch_shuffle,
    tbn_in_distance,
)
from dyntta.analysis.clusterings import CLUSTERINGS
from dyntta.analysis.common import StreamOptions, Subject, read_rows, write_rows
from dyntta.arguments import device, non_negative_int, path, positive_int
from dyntta.atomic import check_writable, write_figure
from dyntta.bench.cli import (
    add_dataset_path_arguments, add_source_arguments, check_recipe, source_options)
from dyntta.data import SCENARIOS
from dyntta.methods.dyn import DYNConfig

DEFAULT_ROWS = 100
"""Dataset rows per domain by default: keeps every analysis on the embedded digits set within
a few minutes on 2 CPU cores (``--n-samples all`` for the whole test set)."""


@dataclasses.dataclass(frozen=True)
class Analysis:
    """A sub-command: its help, its own options and how to compute its rows from the args."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    compute: Callable[[Subject, StreamOptions, argparse.Namespace], list[dict[str, Any]]]
    plot: Callable[[list[dict[str, Any]]], Any]


def _severities(p):
    p.add_argument("--severities", nargs="+", type=int, metavar="S",
                   help="severities of the sweep (default: all the dataset holds)")


def _patch_options(p):
    p.add_argument("--grids", nargs="+", type=int, metavar="N",
                   help="patches per side (default: powers of two up to half the image side)")
    p.add_argument("--methods", nargs="+", default=list(patch_shuffle.DEFAULT_METHODS),
                   help="registered methods to evaluate (default: source tbn)")


def _alpha_options(p):
    p.add_argument("--alphas", nargs="+", type=float, default=list(alpha_sweep.DEFAULT_ALPHAS),
                   metavar="A", help="weights of the source statistics (default 0, 0.1, ..., 1)")
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS,
                   default=list(alpha_sweep.DEFAULT_SCENARIOS),
                   help="streams (default: continual = static, crossmix = dynamic)")


def _dyn_alpha(p):
    p.add_argument("--alpha", type=float, default=DYNConfig.alpha,
                   help=f"DYN's weight of the source statistics (default {DYNConfig.alpha})")


def _clustering_options(p):
    _dyn_alpha(p)
    p.add_argument("--clusterings", nargs="+", choices=list(CLUSTERINGS),
                   default=list(clustering_ablation.DEFAULT_CLUSTERINGS),
                   help="clusterings plugged into DYN (default: %(default)s)")


ANALYSES: dict[str, Analysis] = {
    tbn_in_distance.NAME: Analysis(
        "distance of instance to batch statistics in deep BN layers, per severity and corruption",
        _severities,
        lambda s, o, a: tbn_in_distance.tbn_in_distance(s, o, a.severities),
        tbn_in_distance.plot),
    patch_shuffle.NAME: Analysis(
        "accuracy when images are cut into n x n patches and shuffled",
        _patch_options,
        lambda s, o, a: patch_shuffle.patch_shuffle_accuracy(s, o, a.grids, a.methods),
        patch_shuffle.plot),
    alpha_sweep.NAME: Analysis(
        "accuracy when mixing source with batch (TBN) or instance (IN) statistics, per alpha",
        _alpha_options,
        lambda s, o, a: alpha_sweep.alpha_sweep(s, o, a.alphas, a.scenarios),
        alpha_sweep.plot),
    clustering_ablation.NAME: Analysis(
        "DYN with LISC replaced by other clusterings (HDBSCAN, DBSCAN, Ward, BIRCH, k-means)",
        _clustering_options,
        lambda s, o, a: clustering_ablation.clustering_ablation(
            s, o, a.clusterings, DYNConfig(alpha=a.alpha)),
        clustering_ablation.plot),
    clusters_per_layer.NAME: Analysis(
        "clusters LISC finds in every BN layer and their agreement with the true domains",
        _dyn_alpha,
        lambda s, o, a: clusters_per_layer.clusters_per_layer(s, o, DYNConfig(alpha=a.alpha)),
        clusters_per_layer.plot),
}


def _rows(text: str) -> int | None:
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {value}")
    return value


def common_arguments() -> argparse.ArgumentParser:
    """Options every analysis takes: data and model (as ``dyntta bench``), stream, output."""
    p = argparse.ArgumentParser(add_help=False)
    data = p.add_argument_group("data and model (as dyntta bench)")
    data.add_argument("--dataset", default="digits",
                      help="dataset kind: digits (the embedded default), cifar10-c, cifar100-c, "
                      "imagenet-c or npz (see dyntta.bench.sources)")
    add_dataset_path_arguments(data)
    add_source_arguments(data)
    data.add_argument("--device", type=device, default="cpu", help="torch device, e.g. cpu or cuda")
    stream = p.add_argument_group("stream")
    stream.add_argument("--scenario", default="crossmix", choices=SCENARIOS,
                        help="stream scenario (default: crossmix)")
    stream.add_argument("--corruptions", nargs="+", metavar="NAME",
                        help="domains (default: every corruption of the dataset)")
    stream.add_argument("--severity", type=int, default=5, choices=range(1, 6), metavar="S",
                        help="severity 1..5 (default 5)")
    stream.add_argument("--batch-size", type=positive_int, default=64, help="batch size (default 64)")
    stream.add_argument("--n-samples", type=_rows, default=DEFAULT_ROWS, metavar="N|all",
                        help=f"dataset rows per domain (default {DEFAULT_ROWS})")
    stream.add_argument("--seed", type=non_negative_int, default=0, help="stream seed (default 0)")
    out = p.add_argument_group("output")
    out.add_argument("--out", type=path, default="runs/analysis",
                     help="output folder for <name>.jsonl and <name>.png (default runs/analysis)")
    out.add_argument("--plot-only", action="store_true",
                     help="redraw the figure from the existing results file, compute nothing")
    out.add_argument("--no-progress", action="store_true",
                     help="hide progress bars while building the default data and model")
    return p


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = common_arguments()
    sub = parser.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS")
    for name, analysis in ANALYSES.items():
        p = sub.add_parser(name, parents=[common], help=analysis.help, description=analysis.help)
        analysis.add_arguments(p)


def load_subject(args: argparse.Namespace) -> Subject:
    """Resolve ``--dataset``/``--checkpoint``... to a model (on ``--device``) and its data."""
    from dyntta.bench.config import DatasetEntry
    from dyntta.bench.sources import resolve_source

    check_recipe(args)
    entry = DatasetEntry(args.dataset, args.dataset_path, recipe=args.recipe)
    source = resolve_source(entry, source_options(args), progress=not args.no_progress)
    model = source.model.to(torch.device(args.device)).eval()
    return Subject(model, source.dataset, source.model_name, source.name)


def run(args: argparse.Namespace) -> int:
    analysis = ANALYSES[args.analysis]
    out = Path(args.out)
    results, figure = out / f"{args.analysis}.jsonl", out / f"{args.analysis}.png"
    if not args.plot_only:
        check_writable(results)  # before the work, not after
        options = StreamOptions(
            scenario=args.scenario,
            corruptions=None if args.corruptions is None else tuple(args.corruptions),
            severity=args.severity,
            batch_size=args.batch_size,
            n_samples=args.n_samples,
            seed=args.seed,
        )
        write_rows(results, analysis.compute(load_subject(args), options, args))
    write_figure(analysis.plot(read_rows(results)), figure)
    print(f"wrote {results} and {figure}")
    return 0
