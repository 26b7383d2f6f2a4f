"""``dyntta refresh`` and ``dyntta calibrate``: preparing a model on clean images of its
deployment's pipeline. ``refresh`` writes its BN statistics re-estimated on them as a new
checkpoint (:func:`~dyntta.models.refresh_statistics`); with ``--check``, whether they need it
(:func:`~dyntta.models.refresh.statistics_hits`). ``calibrate`` reads ``dyn_adaptive``'s source
weights for it (:func:`~dyntta.methods.source_weights.calibrate_source_weights`)."""

from __future__ import annotations

import argparse

from dyntta.arguments import non_negative_int, path, positive_int

ROWS = {"all": slice(None), "even": slice(0, None, 2), "odd": slice(1, None, 2)}


def add_model_arguments(p: argparse.ArgumentParser, images: str) -> None:
    """The images (``images`` says what they must hold), the model and which rows to read."""
    p.add_argument("images", type=path, help="clean images of the deployment's pipeline: an .npz "
                   f"with {images}")
    p.add_argument("--checkpoint", type=path, required=True, help="the model (as dyntta bench "
                   "reads it: a checkpoint of a known architecture, or with --model a state dict)")
    p.add_argument("--model", metavar="PACKAGE.MODULE:FUNCTION", help="your own model's factory "
                   "(as dyntta bench --model)")
    p.add_argument("--rows", choices=list(ROWS), default="all",
                   help="which rows of the .npz (even / odd: one half, the other kept for tests)")
    p.add_argument("--images", dest="count", type=positive_int,
                   help="a random N of those rows, drawn by --seed (default: all)")
    p.add_argument("--seed", type=non_negative_int, default=0)


def chosen_images(args: argparse.Namespace, labelled: bool, shuffled: bool = False):
    """The images (and, where ``labelled``, the labels; else None) of the .npz ``args.images``,
    checked, at the rows ``--rows`` names: a random ``--images`` of them drawn by ``--seed``, or
    all of them (in that random order where ``shuffled``)."""
    import numpy as np
    import torch

    from dyntta.data.datasets import check_images, check_labels, load_npz

    images, labels = load_npz(args.images, "clean images", labels=labelled)
    check_images(images, f"{args.images} (x)")
    if labelled:
        check_labels(labels, f"{args.images} (y)")
    rows = np.arange(len(images))[ROWS[args.rows]]
    count = len(rows) if shuffled and args.count is None else args.count
    if count is not None:
        if count > len(rows):
            raise ValueError(f"--images {count}: the {args.rows} rows of {args.images} "
                             f"hold {len(rows)}")
        draw = torch.randperm(len(rows), generator=torch.Generator().manual_seed(args.seed))
        rows = rows[draw[:count].numpy()]
    return images[rows], labels[rows] if labelled else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p, "x uint8 (N, H, W, 3) (and labels y for --check)")
    p.add_argument("--batch-size", type=positive_int, default=100)
    p.add_argument("--out", type=path, help="the checkpoint to write (needed unless --check; "
                   "with --model, its state dict)")
    p.add_argument("--check", action="store_true", help="write nothing: compare the model's "
                   "accuracy on the labelled images with its own BN statistics and with each "
                   "batch's (TBN), in batches of --batch-size of rows in the order --seed draws, "
                   "to see whether they need a refresh")


def run(args: argparse.Namespace) -> int:
    import torch

    from dyntta.atomic import check_writable
    from dyntta.data.datasets import to_tensor
    from dyntta.models import refresh_statistics, save_checkpoint, statistics_hits
    from dyntta.models.checkpoint import save_atomic
    from dyntta.models.factory import load_model

    if args.out is None and not args.check:
        raise ValueError("give --out (the checkpoint to write) or --check")
    if args.out is not None:
        check_writable(args.out)
    # --check draws all the rows by default: batches of mixed rows, whatever the file's order
    images, labels = chosen_images(args, labelled=args.check, shuffled=args.check)
    model = load_model(args.checkpoint, args.model)
    if args.check:
        print(verdict(statistics_hits(model, to_tensor(images),
                                      torch.from_numpy(labels).long(), args.batch_size),
                      f"{len(images)} {args.rows} rows of {args.images}", args.batch_size))
        return 0
    refresh_statistics(model, to_tensor(images), args.batch_size)
    if args.model:
        save_atomic(model.state_dict(), args.out)
    else:
        save_checkpoint(model, args.out)
    print(f"{args.out}: BN statistics of {len(images)} images ({args.rows} rows of {args.images})")
    return 0


def verdict(hits: tuple[list[int], list[int], list[int]], images: str, batch_size: int) -> str:
    """One line from :func:`~dyntta.models.refresh.statistics_hits`: both accuracies, their
    difference with its paired 95% interval over the batches, and what it says."""
    from dyntta.models.refresh import statistics_gap

    source, tbn, low, high = statistics_gap(hits)
    if high < 0:
        say = "its BN statistics do not describe these images: refresh them (without --check)"
    else:
        say = "its BN statistics describe these images as well as each batch's own or better"
    return (f"{images}: its own BN statistics {source:.1f}%, each batch's (TBN, batches of "
            f"{batch_size}) {tbn:.1f}%; difference {source - tbn:+.1f} [{low:+.1f}, {high:+.1f}] "
            f"(paired 95% interval over the batches): {say}")


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p, "x uint8 (N, H, W, 3) (and labels y for --labels); a few thousand "
                        "resolve differences of a point or two")
    p.add_argument("--labels", action="store_true", help="the true labels as the reference "
                   "(default: the model's own predictions on the clean images, TBN)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="the batch size of the "
                   "reading (that of the deployment; the shipped readings took 64)")


def run_calibrate(args: argparse.Namespace) -> int:
    import torch

    from dyntta.data.datasets import to_tensor
    from dyntta.methods.source_weights import TABLE_HEADER, calibrate_source_weights, table_rows
    from dyntta.models.factory import load_model

    images, labels = chosen_images(args, labelled=args.labels)
    reference = torch.from_numpy(labels).long() if args.labels else None
    result = calibrate_source_weights(load_model(args.checkpoint, args.model),
                                      to_tensor(images), reference,
                                      batch_size=args.batch_size, seed=args.seed)
    print(TABLE_HEADER)
    print("\n".join(table_rows(result, str(args.checkpoint))))
    options = result.options.items()
    print("\nin the model's [[datasets]] entry of a grid: options.dyn_adaptive = { "
          + ", ".join(f"{name} = {value!r}" for name, value in options) + " }")
    print('in Python: dyntta.adapt(model, "dyn_adaptive", '
          + ", ".join(f"{name}={value!r}" for name, value in options) + ")")
    return 0
