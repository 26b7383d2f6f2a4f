"""``dyntta bench``, ``dyntta train`` and ``dyntta report``."""

from __future__ import annotations

import argparse
import re
from importlib import resources
from pathlib import Path

DEFAULT_GRID = "default.toml"


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """Options naming where data, checkpoints and caches are (shared with ``dyntta analyze``)."""
    p.add_argument("--data-dir", help="folder that relative dataset/checkpoint paths start from")
    p.add_argument("--checkpoint", help="source model for every dataset (overrides the grid's)")
    p.add_argument("--cache-dir", help="where built data and trained models are cached "
                   "(default $DYNTTA_CACHE or ~/.cache/dyntta)")


def source_options(args: argparse.Namespace):
    from dyntta.bench.sources import SourceOptions

    return SourceOptions(args.data_dir, args.cache_dir, args.checkpoint)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="grid file (TOML, see configs/); default: the embedded "
                   "digits grid laid out like the paper's Table 1")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a grid field, e.g. --set stream.batch_sizes=[16,64]")
    p.add_argument("--methods", nargs="+", help="run only these methods")
    p.add_argument("--seeds", nargs="+", type=int, help="seeds (override the grid's)")
    p.add_argument("--dataset", help="replace the grid's datasets by this one (see sources.py); "
                   "with the embedded grid, every row of it is used unless stream.n_samples is set")
    p.add_argument("--dataset-path", help="path of --dataset (folder, or .npz for 'npz')")
    add_source_arguments(p)
    p.add_argument("--out", help="run folder (default runs/<grid title>)")
    p.add_argument("--workers", type=int, default=1, help="parallel worker processes")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run_bench(args: argparse.Namespace) -> int:
    from dyntta.bench.config import load_grid
    from dyntta.bench.report import table, write_report
    from dyntta.bench.runner import run_grid

    overrides = []
    if args.dataset and not args.config:  # the embedded grid's row cut and title are digits'
        overrides += ['stream.n_samples="all"', f'title="Table 1 layout on {args.dataset}"']
    overrides += args.overrides  # after those, so that --set stream.n_samples=N wins
    if args.methods:
        overrides.append(f"methods={args.methods!r}".replace("'", '"'))
    if args.seeds:
        overrides.append(f"seeds={args.seeds}")
    if args.dataset:
        path = f', path = "{args.dataset_path}"' if args.dataset_path else ""
        overrides.append(f'datasets=[{{name = "{args.dataset}"{path}}}]')
    if args.config:
        grid = load_grid(args.config, overrides)
    else:
        with resources.as_file(resources.files("dyntta.bench") / DEFAULT_GRID) as path:
            grid = load_grid(path, overrides)
    out = Path(args.out or Path("runs") / slug(grid.title))
    records = run_grid(grid, out / "results.jsonl", source_options(args), args.workers,
                       args.device, progress=not args.no_progress)
    write_report(records, out, grid.title)
    print(f"# {grid.title}\n")
    print(table(records, list(grid.columns))[0])
    print(f"results and report in {out}/")
    return 0


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--npz", help="training set as .npz with x uint8 (N, H, W, 3) and y labels "
                   "(default: the embedded digits training split)")
    p.add_argument("--arch", default="resnet20", help="architecture (see dyntta.models)")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="checkpoint file to write")
    p.add_argument("--no-progress", action="store_true")


def run_train(args: argparse.Namespace) -> int:
    from dyntta.bench.train import train_classifier
    from dyntta.data import load_digits_split, load_npz
    from dyntta.models import save_checkpoint

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
    p.add_argument("results", help="results file (JSON lines) written by dyntta bench")
    p.add_argument("--out", help="folder for table.md, table.csv and plots (default: beside it)")
    p.add_argument("--columns", nargs="+", help="table columns (default: the fields that vary)")
    p.add_argument("--title", default="dyntta benchmark")


def run_report(args: argparse.Namespace) -> int:
    from dyntta.bench.report import table, write_report
    from dyntta.bench.results import read_results

    path = Path(args.results)
    if not path.is_file():
        raise FileNotFoundError(f"results file not found: {path}")
    records = read_results(path)
    written = write_report(records, Path(args.out or path.parent), args.title)
    print(table(records, args.columns)[0])
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "run"
