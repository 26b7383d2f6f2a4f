"""``dyntta bench``, ``dyntta train`` and ``dyntta report``."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

from dyntta.arguments import device, non_negative_int, path, positive_float, positive_int

DEFAULT_GRID = "default.toml"


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """Options naming where data, checkpoints and caches are (shared with ``dyntta analyze``)."""
    p.add_argument("--data-dir", type=path, help="folder that relative dataset/checkpoint paths start from "
                   "(default: the current folder)")
    p.add_argument("--checkpoint", type=path, help="source model for every dataset (overrides the grid's)")
    p.add_argument("--model", metavar="PACKAGE.MODULE:FUNCTION", help="source model for every "
                   "dataset, built by your own function (or class) returning an nn.Module that "
                   "maps images in [0, 1] to logits; --checkpoint is then a state dict loaded "
                   "into it (the current folder is importable)")
    p.add_argument("--cache-dir", type=path, help="where built data and trained models are cached "
                   "(default $DYNTTA_CACHE or ~/.cache/dyntta)")


def add_dataset_path_arguments(p: argparse.ArgumentParser) -> None:
    """``--dataset-path`` and ``--recipe`` of ``--dataset`` (shared with ``dyntta analyze``)."""
    from dyntta.data.corruptions import RECIPES

    p.add_argument("--dataset-path", type=path, help="path of --dataset (folder, or .npz for 'npz')")
    p.add_argument("--recipe", choices=RECIPES, help="corruption parameters for --dataset npz "
                   "(default: by image size; images neither 32x32 nor 224x224 need one)")


def check_recipe(args: argparse.Namespace) -> None:
    if args.recipe and args.dataset != "npz":
        raise ValueError("--recipe is for --dataset npz (images corrupted here)")


def source_options(args: argparse.Namespace):
    from dyntta.bench.sources import SourceOptions

    return SourceOptions(args.data_dir, args.cache_dir, args.checkpoint, model=args.model)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    from dyntta.bench.sources import DATASETS

    p.add_argument("--config", type=path, help="grid file (TOML, see configs/); default: the embedded "
                   "digits grid laid out like the paper's Table 1")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a grid field, e.g. --set stream.batch_sizes=[16,64]")
    p.add_argument("--methods", nargs="+", help="run only these methods")
    p.add_argument("--seeds", nargs="+", type=non_negative_int, help="seeds (override the grid's)")
    p.add_argument("--protocol", choices=("dyn-paper", "published"),
                   help="baseline hyper-parameters: the DYN paper's shared setting (default) or "
                   "each method's own published ones (overrides the grid's)")
    p.add_argument("--dataset", help=f"replace the grid's datasets by this one ({', '.join(DATASETS)}); "
                   "with the embedded grid, every row of it is used unless stream.n_samples is set")
    add_dataset_path_arguments(p)
    add_source_arguments(p)
    p.add_argument("--compile", action="store_true", help="torch.compile the networks of the "
                   "backward-free methods (fine-tuning methods run eagerly); wall times include "
                   "the compilation; --set 'compile={backend=\"aot_eager\"}' instead passes "
                   "torch.compile's arguments")
    p.add_argument("--out", type=path, help="run folder (default runs/<grid title>)")
    p.add_argument("--workers", type=positive_int, default=1, help="parallel worker processes")
    p.add_argument("--device", type=device, default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    # Where cells run (the grid's [executor] table; these flags override it).
    p.add_argument("--executor", choices=("process", "slurm"), help="process: here or "
                   "--workers local processes (default); slurm: one Slurm job per cell (submitit)")
    p.add_argument("--slurm-partition", help="Slurm partition (default: the cluster's default)")
    p.add_argument("--slurm-time", type=int, help="time limit per cell in minutes (default 60)")
    p.add_argument("--gpus-per-cell", type=int, help="GPUs per Slurm job (default 0)")
    p.add_argument("--cpus-per-cell", type=int, help="CPUs (and torch threads) per Slurm job "
                   "(default 1)")
    p.add_argument("--array-parallelism", type=int, help="Slurm jobs running at once (default 64)")

EXECUTOR_FLAGS = ("slurm_partition", "slurm_time", "gpus_per_cell", "cpus_per_cell",
                  "array_parallelism")


def run_bench(args: argparse.Namespace) -> int:
    from dyntta.bench.api import run, slug
    from dyntta.bench.config import load_grid
    from dyntta.bench.executors import CellsFailed

    if args.dataset_path and not args.dataset:
        raise ValueError("--dataset-path needs --dataset (which kind of data it is: "
                         "cifar10-c, cifar100-c, imagenet-c or npz)")
    check_recipe(args)
    overrides = []
    if args.dataset and not args.config:  # the embedded grid's row cut and title are digits'
        overrides += ['stream.n_samples="all"', f'title="Table 1 layout on {args.dataset}"']
    if args.compile:
        overrides.append("compile=true")
    overrides += args.overrides  # after those, so that --set stream.n_samples=N wins
    if args.methods:
        overrides.append(f"methods={args.methods!r}".replace("'", '"'))
    if args.seeds:
        overrides.append(f"seeds={args.seeds}")
    if args.protocol:
        overrides.append(f'protocol="{args.protocol}"')
    executor = {"kind": args.executor, **{k: getattr(args, k) for k in EXECUTOR_FLAGS}}
    overrides += [f"executor.{k}={json.dumps(v)}" for k, v in executor.items() if v is not None]
    if args.dataset:
        path = f", path = {json.dumps(args.dataset_path)}" if args.dataset_path else ""
        recipe = f', recipe = "{args.recipe}"' if args.recipe else ""
        overrides.append(f'datasets=[{{name = "{args.dataset}"{path}{recipe}}}]')
    if args.config:
        grid = load_grid(args.config, overrides)
    else:
        with resources.as_file(resources.files("dyntta.bench") / DEFAULT_GRID) as path:
            grid = load_grid(path, overrides)
    out = Path(args.out or Path("runs") / slug(grid.title)).expanduser()
    try:
        result = run(grid, args.model, checkpoint=args.checkpoint, out=out,
                     data_dir=args.data_dir, cache_dir=args.cache_dir, workers=args.workers,
                     device=args.device, progress=not args.no_progress)
    except CellsFailed as exc:
        print(f"dyntta bench: {exc}\nthe other cells are in {out / 'results.jsonl'}; the same "
              "command again runs only the missing cells", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"the finished cells are kept in {out / 'results.jsonl'}; run "
                                "the same command again to resume") from None
    print(f"# {grid.title}\n")
    print(result.table)
    print(f"results and report in {out}/")
    return 0


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--npz", type=path, help="training set as .npz with x uint8 (N, H, W, 3) and y labels "
                   "(default: the embedded digits training split)")
    p.add_argument("--arch", default="resnet20", help="architecture (see dyntta.models)")
    p.add_argument("--epochs", type=positive_int, default=15)
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--out", type=path, required=True, help="checkpoint file to write")
    p.add_argument("--no-progress", action="store_true")


def run_train(args: argparse.Namespace) -> int:
    from dyntta.atomic import check_writable
    from dyntta.bench.train import train_classifier
    from dyntta.data import load_digits_split, load_npz
    from dyntta.models import save_checkpoint

    args.out = Path(args.out).expanduser()
    check_writable(args.out)  # before training, not after
    if args.npz:
        x, y = load_npz(args.npz, "training set")
    else:
        x, y = load_digits_split()[:2]
    model = train_classifier(x, y, arch=args.arch, epochs=args.epochs, batch_size=args.batch_size,
                             lr=args.lr, seed=args.seed, progress=not args.no_progress)
    save_checkpoint(model, args.out, classes=[str(k) for k in range(int(y.max()) + 1)])
    print(f"saved {args.out}")
    return 0


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=path, help="results file (JSON lines) written by dyntta bench")
    p.add_argument("--out", type=path, help="folder for table.md, table.csv and plots (default: beside it)")
    from dyntta.bench.config import COLUMN_KEYS

    p.add_argument("--columns", nargs="+", choices=COLUMN_KEYS,
                   help="table columns (default: the fields that vary)")
    p.add_argument("--title", default="dyntta benchmark")
    p.add_argument("--paper", nargs="?", const="", type=path, metavar="CSV",
                   help="also compare with the DYN paper (written to paper.md): its accuracies "
                   "beside ours where the dataset and stream match, gains over source and TBN, "
                   "rank agreement, and a verdict on each of its claims the runs cover; CSV: "
                   "another published-numbers file (columns: see dyntta.bench.paper)")


def run_report(args: argparse.Namespace) -> int:
    from dyntta.atomic import write_atomic
    from dyntta.bench.paper import PUBLISHED, comparison, published_rows
    from dyntta.bench.report import check_record, table, write_report
    from dyntta.bench.results import read_results

    path = Path(args.results).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"results file not found: {path}")
    records = read_results(path, check=check_record)
    rows = None if args.paper is None else published_rows(args.paper or PUBLISHED)
    out = Path(args.out or path.parent).expanduser()
    written = write_report(records, out, args.title)
    print(table(records, args.columns)[0])
    if rows is not None:
        text = comparison(records, rows)
        write_atomic(out / "paper.md", f"# {args.title}: the DYN paper beside ours\n\n{text}")
        written.append(out / "paper.md")
        print(text)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0

