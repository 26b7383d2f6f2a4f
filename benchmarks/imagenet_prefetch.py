"""ImageNet-C decoding with and without background prefetch: images / s and peak memory.

    python benchmarks/imagenet_prefetch.py                     # 256 JPEGs, B = 32, 3 repeats
    python benchmarks/imagenet_prefetch.py --images 512 --method source --arch resnet50-imagenet

Makes an ImageNet-C-layout folder of generated 224x224 JPEGs (``--folder``, default a temporary
one; 4 corruptions at severity 5, 8 classes; smooth colour fields plus noise, JPEG quality 85)
and streams it as CrossMix batches through two workloads:

- ``decode``: iterate the stream only (JPEG decoding and batch assembly, nothing else);
- ``adapt``: ``--method`` (default DYN) on ``--arch`` (default torchvision-layout ResNet-18,
  randomly initialised, ImageNet normalisation), one forward per batch, as ``dyntta bench`` does;
- ``sleep``: a model that runs elsewhere (an accelerator) simulated by ``--sleep`` seconds per
  batch that leave the CPU free (``time.sleep``), the case where decoding matters most.

Each (workload, prefetch) run is a fresh subprocess, so its peak resident memory (``ru_maxrss``)
is its own; runs are interleaved (prefetch 0, N, 0, N, ...) so machine load affects both alike.
Prints a Markdown table: median images / s over ``--repeats`` runs and their range, the ratio to
prefetch 0, the median share of the wall time the loop spent waiting for its next batch (the
decoding left on the critical path), the largest peak RSS and the range of the 1-minute load
average at the runs' ends.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

CORRUPTIONS = ("gaussian_noise", "defocus_blur", "snow", "contrast")
CLASSES = 8


def make_folder(root: Path, images: int, seed: int = 0) -> Path:
    """``images`` 224x224 JPEGs per corruption spread over ``CLASSES`` class folders."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:224, 0:224] / 224.0
    for corruption in CORRUPTIONS:
        for i in range(images // len(CORRUPTIONS)):
            folder = root / corruption / "5" / f"n{i % CLASSES:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            a, b, c = rng.uniform(0, 2 * np.pi, 3)
            field = np.stack([np.sin(6 * xx + a), np.cos(5 * yy + b), np.sin(4 * (xx + yy) + c)], -1)
            pixels = 127.5 * (1 + field) + rng.normal(0, 20, field.shape)
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
                folder / f"ILSVRC2012_val_{i:08d}.JPEG", quality=85)
    return root


def child(folder: str, workload: str, prefetch: int, batch: int, method: str, arch: str,
          sleep: float) -> dict:
    """One timed pass in this process; returns images / s and peak RSS in MiB."""
    import torch

    import dyntta
    from dyntta.data import ImageFolderCorruptedDataset, make_stream
    from dyntta.models import Normalized, build
    from dyntta.models.checkpoint import IMAGENET_MEAN, IMAGENET_STD

    dataset = ImageFolderCorruptedDataset(folder)
    stream = make_stream(dataset, corruptions=list(CORRUPTIONS), scenario="crossmix",
                         batch_size=batch, seed=0, prefetch=prefetch)
    adapted = None
    if workload == "adapt":
        torch.manual_seed(0)
        model = Normalized(build(arch, num_classes=1000), IMAGENET_MEAN, IMAGENET_STD).eval()
        adapted = dyntta.adapt(model, method)
    start = time.perf_counter()
    n, waited = 0, 0.0
    batches = iter(stream)
    with torch.no_grad():
        while True:
            asked = time.perf_counter()
            b = next(batches, None)
            waited += time.perf_counter() - asked
            if b is None:
                break
            if adapted is not None:
                adapted(b.x)
            elif workload == "sleep":
                time.sleep(sleep)
            n += len(b.y)
    seconds = time.perf_counter() - start
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"images_per_s": n / seconds, "peak_rss_mib": rss_mib, "images": n,
            "waiting": waited / seconds, "load_1min": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256, help="JPEGs in total (default 256)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--prefetch", type=int, default=2, help="batches decoded ahead (default 2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--method", default="dyn")
    parser.add_argument("--arch", default="resnet18-imagenet")
    parser.add_argument("--workloads", nargs="+", default=["decode", "sleep", "adapt"],
                        choices=["decode", "sleep", "adapt"])
    parser.add_argument("--sleep", type=float, default=0.1,
                        help="seconds per batch of the 'sleep' workload (default 0.1)")
    parser.add_argument("--folder", type=Path, help="reuse or create the JPEG folder here")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "PREFETCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(str(args.folder), args.child[0], int(args.child[1]), args.batch_size,
                       args.method, args.arch, args.sleep)
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or Path(tmp) / "ImageNet-C"
        if not folder.is_dir():
            make_folder(folder, args.images)
        print(f"load average before: {os.getloadavg()}", file=sys.stderr)
        results: dict[tuple[str, int], list[dict]] = {}
        for workload in args.workloads:
            for _ in range(args.repeats):
                for prefetch in (0, args.prefetch):
                    out = subprocess.run(
                        [sys.executable, __file__, "--folder", str(folder), "--child", workload,
                         str(prefetch), "--batch-size", str(args.batch_size), "--method",
                         args.method, "--arch", args.arch, "--sleep", str(args.sleep)],
                        check=True, capture_output=True, text=True,
                    ).stdout
                    results.setdefault((workload, prefetch), []).append(json.loads(out))
        print(f"load average after: {os.getloadavg()}", file=sys.stderr)
    print(f"| workload | prefetch | images / s (median of {args.repeats}) | runs | ratio | "
          "waiting for data | peak RSS MiB | load (1 min) |")
    print("|---|---|---|---|---|---|---|---|")
    for workload in args.workloads:
        base = statistics.median(r["images_per_s"] for r in results[(workload, 0)])
        for prefetch in (0, args.prefetch):
            runs = results[(workload, prefetch)]
            speeds = [r["images_per_s"] for r in runs]
            loads = [r["load_1min"] for r in runs]
            label = {"decode": "decode only", "sleep": f"sleep {args.sleep} s / batch",
                     "adapt": f"{args.method} on {args.arch}"}[workload]
            print(f"| {label} | {prefetch} | {statistics.median(speeds):.1f} | "
                  f"{min(speeds):.1f}-{max(speeds):.1f} | {statistics.median(speeds) / base:.2f} | "
                  f"{statistics.median(r['waiting'] for r in runs):.1%} | "
                  f"{max(r['peak_rss_mib'] for r in runs):.0f} | {min(loads):.1f}-{max(loads):.1f} |")


if __name__ == "__main__":
    main()
