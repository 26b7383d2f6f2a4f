"""``dyn_adaptive``'s source weights for each model of a grid, read on clean images
(:func:`~dyntta.methods.source_weights.calibrate_source_weights`), as a Markdown table: for each
option, the agreement at each candidate value, its paired 95% interval against the default, and
the value chosen.

The images are the clean ones the grid's streams corrupt (an ``npz`` file's, or the digits' test
split), without their labels unless ``--labels``: all of them, or ``--images`` drawn by ``--seed``.

    PYTHONPATH=src:. python benchmarks/calibrate_source_weights.py \
        --grid configs/successor_architectures.toml --data-dir ../shared/data
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from dyntta.bench.config import load_grid
from dyntta.bench.sources import SourceOptions, resolve_path, resolve_source
from dyntta.data.datasets import load_npz, to_tensor
from dyntta.data.digits import load_digits_split
from dyntta.methods.source_weights import TABLE_HEADER, calibrate_source_weights, table_rows


def clean_images(entry, options: SourceOptions) -> tuple[np.ndarray, np.ndarray]:
    """The clean images and labels whose corruptions the grid's streams of ``entry`` hold."""
    if entry.name == "npz":
        return load_npz(resolve_path(entry.path, options))
    if entry.name == "digits":
        return load_digits_split()[2:]
    raise ValueError(f"dataset {entry.name!r}: no clean images here (npz or digits only)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", required=True)
    parser.add_argument("--data-dir")
    parser.add_argument("--images", type=int, help="clean images read per model (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--labels", action="store_true",
                        help="the true labels as the reference (default: the model's TBN "
                        "predictions on the clean images)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    options = SourceOptions(args.data_dir, None, severities=(5,))
    print(TABLE_HEADER)
    for entry in load_grid(args.grid).datasets:
        source = resolve_source(entry, options, progress=False, quiet=True)
        x, y = clean_images(entry, options)
        rows = np.sort(np.random.default_rng(args.seed).permutation(len(y))[: args.images])
        labels = torch.from_numpy(y[rows]).long() if args.labels else None
        result = calibrate_source_weights(source.model, to_tensor(x[rows]), labels,
                                          seed=args.seed)
        print("\n".join(table_rows(result, source.model_name)), flush=True)


if __name__ == "__main__":
    main()
