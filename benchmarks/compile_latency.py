"""Forward latency of eager and ``torch.compile``d methods, as a Markdown table.

    OMP_NUM_THREADS=1 python benchmarks/compile_latency.py --models resnet26 --repeats 5
    OMP_NUM_THREADS=1 python benchmarks/compile_latency.py --models resnet50 --warmup 0 --repeats 1

For each model (``dyntta.models.build``, randomly initialised, wrapped in ``Normalized``, CIFAR
input 32x32) and method, one eager and one compiled method (``dyntta.adapt(..., compile=True)``,
inductor). The compiled method's first call, at the first batch size, is timed alone: the
compile time (tracing, inductor's code generation and one run). Then, per batch size, warm-up
rounds and timed rounds; each round calls every (method, eager / compiled) once on the same
fresh batch, in turn, so machine load affects them alike. Reported: median ms per batch,
compiled / eager speed-up, DYN compiled / source eager (goal: <= 1) with a 95% percentile
bootstrap interval over rounds (paired by round; one round gives no interval), the graphs
compiled so far (one graph serves every batch size when the count stays put), and the cost of
the input value check (``check_values``, one ``aminmax``) relative to the source's eager forward.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dyntta
from dyntta.bench.stats import median_interval
from dyntta.methods.base import check_values
from dyntta.models import Normalized, build

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def interval(ratios: list[float]) -> str:
    """Median of ``ratios`` with a 95% percentile bootstrap interval of the median."""
    median, low, high = median_interval(ratios)
    return f"{median:.2f}" if len(ratios) < 2 else f"{median:.2f} [{low:.2f}, {high:.2f}]"


def run(arch: str, methods: list[str], batch_sizes: list[int], warmup: int, repeats: int,
        clock: str, seed: int) -> list[str]:
    now = CLOCKS[clock]
    torch.manual_seed(seed)
    model = Normalized(build(arch), (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)).eval()
    eager = {m: dyntta.adapt(model, m) for m in methods}
    compiled = {m: dyntta.adapt(model, m, compile=True) for m in methods}
    generator = torch.Generator().manual_seed(seed)
    rows, notes = [], []
    x = torch.rand(batch_sizes[0], 3, 32, 32, generator=generator)
    for m in methods:
        start = now()
        compiled[m](x)
        notes.append(f"{m} {now() - start:.1f} s")
    print(f"{arch}: compile time (first call, B = {batch_sizes[0]}): {', '.join(notes)}; "
          f"graphs {graphs_compiled()}", flush=True)
    for b in batch_sizes:
        times: dict[tuple[str, str], list[float]] = {
            (m, kind): [] for m in methods for kind in ("eager", "compiled")}
        check = []
        for i in range(warmup + repeats):
            x = torch.rand(b, 3, 32, 32, generator=generator)
            for m in methods:
                for kind, method in (("eager", eager[m]), ("compiled", compiled[m])):
                    start = now()
                    method(x)
                    if i >= warmup:
                        times[m, kind].append(now() - start)
            start = now()
            check_values(x)
            if i >= warmup:
                check.append(now() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        for m in methods:
            ratio = interval([c / s for c, s in zip(times[m, "compiled"],
                                                     times["source", "eager"])])
            rows.append(
                f"| {arch} | {b} | {m} | {1e3 * med[m, 'eager']:.1f} | "
                f"{1e3 * med[m, 'compiled']:.1f} | {med[m, 'eager'] / med[m, 'compiled']:.2f} | "
                f"{ratio} | {graphs_compiled()} |")
        share = statistics.median(check) / med["source", "eager"]
        print(f"{arch} B={b}: value check {1e3 * statistics.median(check):.2f} ms "
              f"= {100 * share:.2f}% of the source's eager forward", flush=True)
        print("\n".join(rows[-len(methods):]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet26", "resnet50"])
    parser.add_argument("--methods", nargs="+", default=["source", "tbn", "dyn"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[16, 64, 256])
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds per batch size")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per batch size")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if "source" not in args.methods or args.repeats < 1 or args.warmup < 0:
        parser.error("need 'source' among --methods, --repeats >= 1 and --warmup >= 0")
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, {args.clock} "
          f"clock, {args.warmup} warm-up + {args.repeats} timed rounds per batch size\n",
          flush=True)
    rows = ["| model | B | method | eager ms | compiled ms | speed-up | compiled / source eager "
            "| graphs so far |", "|---|---:|---|---:|---:|---:|---|---:|"]
    for arch in args.models:
        rows += run(arch, args.methods, args.batch_sizes, args.warmup, args.repeats, args.clock,
                    args.seed)
    print("\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
