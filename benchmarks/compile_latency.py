"""Forward latency of eager and ``torch.compile``d methods, as a Markdown table.

    OMP_NUM_THREADS=1 python benchmarks/compile_latency.py --models resnet26 --repeats 5
    OMP_NUM_THREADS=1 python benchmarks/compile_latency.py --models resnet50 --warmup 0 --repeats 1
    OMP_NUM_THREADS=1 python benchmarks/compile_latency.py --compile-only --models resnet20 \
        --methods source tbn dyn dyn_adaptive --rounds 2
    python benchmarks/compile_latency.py --device cuda --models resnet26 --batch-sizes 64 \
        [--mode reduce-overhead]

For each model (``dyntta.models.build``, randomly initialised, wrapped in ``Normalized``, CIFAR
input 32x32) and method, one eager and one compiled method (``dyntta.adapt(..., compile=True)``,
inductor). The compiled method's first call, at the first batch size, is timed alone: the
compile time (tracing, inductor's code generation and one run). Then, per batch size, warm-up
rounds and timed rounds; each round calls every (method, eager / compiled) once on the same
fresh batch, in turn, so machine load affects them alike. Reported: median ms per batch,
compiled / eager speed-up, DYN compiled / source eager (goal: <= 1) with a 95% percentile
bootstrap interval over rounds (paired by round; one round gives no interval), the graphs
compiled so far (one graph serves every batch size when the count stays put), the share of the
timed batches' predictions the compiled method shares with the eager one (each fed the same
batches), and the cost of the input value check (``check_values``, one ``aminmax``) relative to
the source's eager forward.

``--compile-only`` times compilation alone, each (model, method) in a fresh process with an empty
inductor cache (nothing reused from another method's or an earlier run's kernels) and inductor's
C++ compiler run in that process (``TORCHINDUCTOR_COMPILE_THREADS=1``), so its CPU time counts
the compiler's (``--clock cpu``: the process's and its finished children's CPU time; the wall
time on a loaded machine mostly measures the load). The timed call is the one in which the
method's graph compiles: the first, or for a method that runs eager until its state keeps its
shape (``dyn_adaptive``'s windows) the first one after that. Reported: seconds per method and
round, and each method's ratio to ``source`` of the same round (rounds run the methods in turn).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import dyntta
from dyntta.bench.stats import median_interval
from dyntta.methods.base import check_values
from dyntta.models import Normalized, build

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
MAX_EAGER_CALLS = 64
"""Calls a compiled method may run eager before its graph compiles (``--compile-only``)."""


def cpu_with_children() -> float:
    """CPU seconds of this process and of its children that have finished (the C++ compiler)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def interval(ratios: list[float]) -> str:
    """Median of ``ratios`` with a 95% percentile bootstrap interval of the median."""
    median, low, high = median_interval(ratios)
    return f"{median:.2f}" if len(ratios) < 2 else f"{median:.2f} [{low:.2f}, {high:.2f}]"


def synchronised(clock):
    """``clock`` read after the GPU has finished the work queued so far."""
    def now() -> float:
        torch.cuda.synchronize()
        return clock()
    return now


def run(arch: str, methods: list[str], batch_sizes: list[int], warmup: int, repeats: int,
        clock: str, seed: int, device: str = "cpu", mode: str | None = None) -> list[str]:
    cuda = torch.device(device).type == "cuda"
    now = synchronised(CLOCKS[clock]) if cuda else CLOCKS[clock]
    torch.manual_seed(seed)
    model = Normalized(build(arch), (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261))
    model = model.eval().to(device)
    eager = {m: dyntta.adapt(model, m) for m in methods}
    options = {"mode": mode} if mode else True
    compiled = {m: dyntta.adapt(model, m, compile=options) for m in methods}
    generator = torch.Generator().manual_seed(seed)
    rows, notes = [], []
    x = torch.rand(batch_sizes[0], 3, 32, 32, generator=generator).to(device)
    for m in methods:
        start = now()
        compiled[m](x)
        notes.append(f"{m} {now() - start:.1f} s")
    print(f"{arch}: compile time (first call, B = {batch_sizes[0]}): {', '.join(notes)}; "
          f"graphs {graphs_compiled()}", flush=True)
    for b in batch_sizes:
        times: dict[tuple[str, str], list[float]] = {
            (m, kind): [] for m in methods for kind in ("eager", "compiled")}
        check, agree = [], {m: [] for m in methods}
        for i in range(warmup + repeats):
            x = torch.rand(b, 3, 32, 32, generator=generator).to(device)
            for m in methods:
                predicted = {}
                for kind, method in (("eager", eager[m]), ("compiled", compiled[m])):
                    start = now()
                    predicted[kind] = method(x).argmax(1)
                    if i >= warmup:
                        times[m, kind].append(now() - start)
                if i >= warmup:
                    agree[m].append((predicted["eager"] == predicted["compiled"]).float().mean())
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
                f"{ratio} | {100 * float(torch.stack(agree[m]).mean()):.2f} | "
                f"{graphs_compiled()} |")
        share = statistics.median(check) / med["source", "eager"]
        print(f"{arch} B={b}: value check {1e3 * statistics.median(check):.2f} ms "
              f"= {100 * share:.2f}% of the source's eager forward", flush=True)
        print("\n".join(rows[-len(methods):]), flush=True)
    return rows


def compile_seconds(arch: str, method: str, batch: int, clock: str, seed: int) -> float:
    """Seconds of the call in which ``method``'s network compiles (this process: run it fresh)."""
    now = cpu_with_children if clock == "cpu" else time.perf_counter
    torch.manual_seed(seed)
    model = Normalized(build(arch), (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)).eval()
    compiled = dyntta.adapt(model, method, compile=True)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(MAX_EAGER_CALLS):
        x = torch.rand(batch, 3, 32, 32, generator=generator)
        before = graphs_compiled()
        start = now()
        compiled(x)
        seconds = now() - start
        if graphs_compiled() > before:
            return seconds
    raise RuntimeError(f"{method} compiled no graph in {MAX_EAGER_CALLS} calls")


def compile_table(archs: list[str], methods: list[str], batch: int, rounds: int, clock: str,
                  seed: int) -> list[str]:
    """Compile seconds per (model, method), each in a fresh process with an empty cache."""
    rows = [f"| model | method | compile s ({clock}), per round | / source, per round |",
            "|---|---|---|---|"]
    for arch in archs:
        seconds: dict[str, list[float]] = {m: [] for m in methods}
        for _ in range(rounds):
            for m in methods:
                with tempfile.TemporaryDirectory() as cache:
                    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache,
                               TORCHINDUCTOR_COMPILE_THREADS="1")
                    out = subprocess.run(
                        [sys.executable, __file__, "--compile-one", arch, m, str(batch), clock,
                         str(seed)], env=env, check=True, capture_output=True, text=True).stdout
                seconds[m].append(float(out.split()[-1]))
                print(f"{arch} {m}: {seconds[m][-1]:.1f} s (load {os.getloadavg()[0]:.1f})",
                      flush=True)
        for m in methods:
            ratios = [t / s for t, s in zip(seconds[m], seconds["source"])]
            rows.append(f"| {arch} | {m} | {', '.join(f'{t:.1f}' for t in seconds[m])} | "
                        f"{', '.join(f'{r:.2f}' for r in ratios)} |")
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
    parser.add_argument("--compile-only", action="store_true",
                        help="time compilation alone, each method in a fresh process (at the "
                        "first batch size)")
    parser.add_argument("--rounds", type=int, default=1, help="--compile-only: rounds")
    parser.add_argument("--device", default="cpu",
                        help="where the latency rounds run (cuda: the clock is read after the "
                        "GPU finishes); --compile-only runs on the CPU")
    parser.add_argument("--mode", help="torch.compile's mode for the latency rounds (e.g. "
                        "reduce-overhead: CUDA graphs on a GPU); default: its default")
    parser.add_argument("--compile-one", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile_one:
        arch, method, batch, clock, seed = args.compile_one
        print(compile_seconds(arch, method, int(batch), clock, int(seed)))
        return
    if "source" not in args.methods or args.repeats < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("need 'source' among --methods, --repeats >= 1, --warmup >= 0 and "
                     "--rounds >= 1")
    cuda = torch.device(args.device).type == "cuda"
    if cuda and (args.compile_only or args.clock == "cpu"):
        parser.error("with --device cuda: the wall clock, and no --compile-only (it times "
                     "compilation for the CPU)")
    if args.compile_only:
        print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, {args.clock} "
              f"clock, B = {args.batch_sizes[0]}, {args.rounds} round(s)\n", flush=True)
        print("\n".join(compile_table(args.models, args.methods, args.batch_sizes[0],
                                      args.rounds, args.clock, args.seed)))
        return
    where = torch.cuda.get_device_name() if cuda else \
        f"CPU, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}, {args.clock} "
          f"clock, {args.warmup} warm-up + {args.repeats} timed rounds per batch size\n",
          flush=True)
    rows = ["| model | B | method | eager ms | compiled ms | speed-up | compiled / source eager "
            "| predictions as eager (%) | graphs so far |",
            "|---|---:|---|---:|---:|---:|---|---:|---:|"]
    for arch in args.models:
        rows += run(arch, args.methods, args.batch_sizes, args.warmup, args.repeats, args.clock,
                    args.seed, args.device, args.mode)
    print("\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
