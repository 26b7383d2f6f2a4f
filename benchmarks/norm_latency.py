"""Forward latency of the backward-free normalisation methods, as ratios to the source model.

    python benchmarks/norm_latency.py --archs resnet26 resnet50 --batch-sizes 16 64 256
    python benchmarks/norm_latency.py --threads 1 --clock cpu    # on a machine shared with others
    python benchmarks/norm_latency.py --device cuda             # on a GPU: wall clock, synchronised

For every (architecture, batch size) the methods are timed interleaved in one process (each
repeat runs every method once, in turn), so machine load affects them alike; the table reports
the median latency per batch, its ratio to source and to TBN, and the median of the per-repeat
ratios to TBN (each method against the TBN call of the same repeat) with a 95% bootstrap
interval, which a machine whose speed drifts between repeats moves less. ``--batches 1`` (the
default) repeats one batch, whose copies fill ``dyn_adaptive``'s deep window and all pass its
match: the window's largest cost; ``--batches K`` cycles K different batches, as a stream does.
The batches are uniform noise, one domain to ``dyn_adaptive``'s spectral test (its first layers
pool the batch); ``--mixed`` blurs half of each, two domains (they search neighbours).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn import functional as F

import dyntta
from dyntta.bench.stats import median_interval
from dyntta.models import Normalized, build

METHODS = {name: (name, {}) for name in ("source", "tbn", "alpha_bn", "dyn", "dyn_adaptive", "datta")}
# the cost of dyn_adaptive's 256-sample shallow window
METHODS["dyn_adaptive shallow64"] = ("dyn_adaptive", {"shallow_window": 64})
# with clean reference images, as the bench runs it: the first stage tests each group of one
# domain against the source's between/within ratios (64 noise images of their own, seeded)
METHODS["dyn_adaptive reference"] = (
    "dyn_adaptive", {"reference": torch.rand(64, 3, 32, 32,
                                             generator=torch.Generator().manual_seed(1))})


def inputs(batch: int, batches: int, mixed: bool) -> list[torch.Tensor]:
    """Uniform noise images, one domain to ``dyn_adaptive``'s spectral test; ``mixed``: the
    second half of each batch blurred (9 x 9 box), so that its spectra say two domains and
    ``dyn_adaptive``'s neighbourhood layers search neighbours."""
    xs = [torch.rand(batch, 3, 32, 32) for _ in range(batches)]
    if mixed:
        for x in xs:
            x[batch // 2 :] = F.avg_pool2d(x[batch // 2 :], 9, 1, 4, count_include_pad=False)
    return xs


def adapted(arch: str, labels: list[str], device: str = "cpu") -> dict[str, torch.nn.Module]:
    """A randomly initialised ``arch`` (seed 0) for images in [0, 1], adapted by each method of
    ``labels`` (keys of :data:`METHODS`)."""
    torch.manual_seed(0)
    model = Normalized(build(arch), (0.5,) * 3, (0.25,) * 3).eval().to(device)
    return {label: dyntta.adapt(model, METHODS[label][0], **{
        name: value.to(device) if isinstance(value, torch.Tensor) else value
        for name, value in METHODS[label][1].items()}) for label in labels}


def time_methods(arch: str, batch: int, repeats: int, warmup: int, clock, batches: int,
                 labels: list[str], mixed: bool = False, device: str = "cpu"
                 ) -> dict[str, list[float]]:
    """Each method's time per repeat (the repeats' i-th entries were timed in turn)."""
    methods = adapted(arch, labels, device)
    xs = [x.to(device) for x in inputs(batch, batches, mixed)]
    times: dict[str, list[float]] = {name: [] for name in labels}
    with torch.inference_mode():
        for i in range(warmup + repeats):
            x = xs[i % batches]
            for name, method in methods.items():
                start = clock()
                method(x)
                if i >= warmup:
                    times[name].append(clock() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", nargs="+", default=["resnet26", "resnet50"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[16, 64, 256])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batches", type=int, default=1,
                        help="different batches cycled (1: one batch repeated)")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS),
                        help="the methods to time (source and tbn always)")
    parser.add_argument("--mixed", action="store_true",
                        help="batches whose halves differ in spectrum (two domains) instead of "
                        "uniform noise (one domain): dyn_adaptive's neighbour search runs")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: elapsed time; cpu: this process's CPU time (for a shared "
                        "machine, with --threads 1)")
    parser.add_argument("--device", default="cpu",
                        help="where the model runs (cuda: the wall clock, read after the "
                        "device finishes its work)")
    args = parser.parse_args()
    if args.batches < 1:
        parser.error(f"--batches must be >= 1, got {args.batches}")
    cuda = torch.device(args.device).type == "cuda"
    if cuda and args.clock == "cpu":
        parser.error("--clock cpu times this process, not the GPU: use the wall clock with cuda")
    labels = list(dict.fromkeys(["source", "tbn", *args.methods]))
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    if cuda:
        def clock():
            torch.cuda.synchronize()
            return time.perf_counter()
    where = torch.cuda.get_device_name() if cuda else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}, {args.clock} clock, "
          f"median of {args.repeats}, {args.batches} different batch(es), "
          f"{'two domains' if args.mixed else 'one domain'} per batch")
    print("| arch | B | method | ms / batch | / source | / TBN | paired / TBN [95%] |")
    print("|---|---:|---|---:|---:|---:|---|")
    for arch in args.archs:
        for batch in args.batch_sizes:
            repeats = args.repeats if arch != "resnet50" or batch < 256 else max(3, args.repeats // 3)
            times = time_methods(arch, batch, repeats, args.warmup, clock, args.batches, labels,
                                 args.mixed, args.device)
            med = {name: statistics.median(t) for name, t in times.items()}
            for name in labels:
                paired = median_interval([t / u for t, u in zip(times[name], times["tbn"])])
                print(
                    f"| {arch} | {batch} | {name} | {1e3 * med[name]:.1f} | "
                    f"{med[name] / med['source']:.2f} | {med[name] / med['tbn']:.2f} | "
                    f"{paired[0]:.3f} [{paired[1]:.3f}, {paired[2]:.3f}] |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
