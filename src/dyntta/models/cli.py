"""``dyntta refresh``: a model's BN statistics re-estimated on clean images, written as a new
checkpoint (:func:`~dyntta.models.refresh_statistics`)."""

from __future__ import annotations

import argparse

from dyntta.arguments import non_negative_int, path, positive_int

ROWS = {"all": slice(None), "even": slice(0, None, 2), "odd": slice(1, None, 2)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", type=path, help="clean images of the deployment's pipeline: an .npz "
                   "with x uint8 (N, H, W, 3) (labels, if any, are not read)")
    p.add_argument("--checkpoint", type=path, required=True, help="the model (as dyntta bench "
                   "reads it: a checkpoint of a known architecture, or with --model a state dict)")
    p.add_argument("--model", metavar="PACKAGE.MODULE:FUNCTION", help="your own model's factory "
                   "(as dyntta bench --model); the checkpoint written is then its state dict")
    p.add_argument("--rows", choices=list(ROWS), default="all",
                   help="which rows of the .npz (even / odd: one half, the other kept for tests)")
    p.add_argument("--images", dest="count", type=positive_int,
                   help="a random N of those rows, drawn by --seed (default: all)")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--batch-size", type=positive_int, default=100)
    p.add_argument("--out", type=path, required=True, help="the checkpoint to write")


def run(args: argparse.Namespace) -> int:
    import torch

    from dyntta.atomic import atomic_path, check_writable
    from dyntta.data.datasets import check_images, load_npz, to_tensor
    from dyntta.models import load_checkpoint, refresh_statistics, save_checkpoint
    from dyntta.models.factory import build_from_factory

    check_writable(args.out)
    images, _ = load_npz(args.images, "clean images", labels=False)
    check_images(images, f"{args.images} (x)")
    images = images[ROWS[args.rows]]
    if args.count is not None:
        if args.count > len(images):
            raise ValueError(f"--images {args.count}: the {args.rows} rows of {args.images} "
                             f"hold {len(images)}")
        draw = torch.randperm(len(images), generator=torch.Generator().manual_seed(args.seed))
        images = images[draw[: args.count].numpy()]
    if args.model:
        model = build_from_factory(args.model, args.checkpoint)
    else:
        model = load_checkpoint(args.checkpoint)
    refresh_statistics(model, to_tensor(images), args.batch_size)
    if args.model:
        with atomic_path(args.out) as tmp:
            torch.save(model.state_dict(), tmp)
    else:
        save_checkpoint(model, args.out)
    print(f"{args.out}: BN statistics of {len(images)} images ({args.rows} rows of {args.images})")
    return 0
