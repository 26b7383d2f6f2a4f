"""Operators each backward-free method runs per forward: what a GPU launches, counted on a CPU.

    PYTHONPATH=src:. python benchmarks/operator_count.py --archs resnet26 --batch-sizes 64 [--mixed]

On a GPU the forward of these methods waits on the host (BENCHMARKS.md, "On a GPU"): each
method costs about what it launches. This counts, for one forward after ``--warmup`` forwards
(so that ``dyn_adaptive``'s windows are full), the ATen operators dispatched in inference mode,
views excluded (they launch nothing): most of the others launch one kernel each on a GPU, a
composite one (``batch_norm``, ``conv2d``) counts once however many it launches. The counts
depend on the code only, not on the machine or its load. Inputs: ``norm_latency.py``'s
(``--mixed``: two domains per batch).
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.norm_latency import METHODS, adapted, inputs


class OperatorCount(TorchDispatchMode):
    """Counts the ATen operators dispatched while active, by name, views excluded."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_operators(method: torch.nn.Module, xs: list[torch.Tensor], warmup: int
                    ) -> collections.Counter[str]:
    """The operators of ``method``'s forward on ``xs[warmup % len(xs)]`` after ``warmup``
    forwards cycling ``xs``."""
    with torch.inference_mode():
        for i in range(warmup):
            method(xs[i % len(xs)])
        with OperatorCount() as count:
            method(xs[warmup % len(xs)])
    return count.counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", nargs="+", default=["resnet26"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[64])
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--mixed", action="store_true",
                        help="two domains per batch (dyn_adaptive's neighbour search runs)")
    parser.add_argument("--top", type=int, default=5, help="the most frequent operators shown")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {'two domains' if args.mixed else 'one domain'} per "
          f"batch, one forward after {args.warmup}")
    print("| arch | B | method | operators | / source | / TBN | most frequent |")
    print("|---|---:|---|---:|---:|---:|---|")
    labels = list(dict.fromkeys(["source", "tbn", *args.methods]))
    for arch in args.archs:
        for batch in args.batch_sizes:
            methods = adapted(arch, labels)
            xs = inputs(batch, 8, args.mixed)
            counts = {label: count_operators(method, xs, args.warmup)
                      for label, method in methods.items()}
            total = {label: sum(c.values()) for label, c in counts.items()}
            for label, c in counts.items():
                top = ", ".join(f"{op} {n}" for op, n in c.most_common(args.top))
                print(f"| {arch} | {batch} | {label} | {total[label]} | "
                      f"{total[label] / total['source']:.2f} | "
                      f"{total[label] / total['tbn']:.2f} | {top} |")


if __name__ == "__main__":
    main()
