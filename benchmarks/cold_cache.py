"""What a BN layer's statistics cost inside the network, against the same call repeated at once
and run alone.

    OMP_NUM_THREADS=1 PYTHONPATH=src:. python benchmarks/cold_cache.py --methods tbn dyn

In a forward each layer's statistics (``statistics()``: TBN's batch statistics; DYN's instance
statistics, LISC, cluster statistics and mix) run right after a convolution, whose weights and
feature maps have just passed through the caches. For every BN layer of a randomly initialised
ResNet-26 on batches whose halves differ in spectrum (``norm_latency.py --mixed``'s), this times
the call as the forward makes it ("in the network"), the same call again at once on the same input
("repeated at once") and, after the forwards, the same call on each layer's recorded input in a
loop over the layers ("alone", as ``norm_layer_overhead.py`` times a layer). CPU time, one thread,
methods interleaved (each repeat runs every method's forward in turn); medians over the repeats of
the sums over the layers, in ms per batch, beside the forward (less the repeated calls).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.norm_latency import adapted, inputs
from dyntta.norm import SourceNorm2d


class LayerClock:
    """Times every BN layer's ``statistics()`` in a model's forwards (a pre-hook per layer)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.layers = [m for m in model.modules() if isinstance(m, SourceNorm2d)]
        self.times: dict[str, list[float]] = {
            "forward": [], "in the network": [], "repeated at once": []}
        self.inputs: dict[SourceNorm2d, torch.Tensor] = {}
        self.spent = {"in the network": 0.0, "repeated at once": 0.0}  # this forward's
        for layer in self.layers:
            layer.register_forward_pre_hook(lambda m, args: self.time_layer(m, args[0]))

    def time_layer(self, layer: SourceNorm2d, x: torch.Tensor) -> None:
        start = time.process_time()
        layer.statistics(x)
        cold = time.process_time()
        layer.statistics(x)
        self.spent["in the network"] += cold - start
        self.spent["repeated at once"] += time.process_time() - cold
        self.inputs[layer] = x

    def forward(self, x: torch.Tensor, record: bool) -> None:
        self.spent = dict.fromkeys(self.spent, 0.0)
        start = time.process_time()
        self.model(x)
        forward = time.process_time() - start - self.spent["repeated at once"]
        if record:
            for name, value in {"forward": forward, **self.spent}.items():
                self.times[name].append(value)

    def alone(self, loops: int) -> list[float]:
        """The layers' statistics on their last recorded inputs, summed over the layers."""
        times = []
        for _ in range(loops):
            start = time.process_time()
            for layer in self.layers:
                layer.statistics(self.inputs[layer])
            times.append(time.process_time() - start)
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet26")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--methods", nargs="+", default=["tbn", "dyn"],
                        choices=["tbn", "alpha_bn", "dyn"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--alone", type=int, default=50, help="loops over the recorded inputs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    clocks = {name: LayerClock(model) for name, model in adapted(args.arch, args.methods).items()}
    xs = inputs(args.batch_size, 8, mixed=True)
    with torch.inference_mode():
        for i in range(args.warmup + args.repeats):
            for clock in clocks.values():
                clock.forward(xs[i % len(xs)], record=i >= args.warmup)
        alone = {name: clock.alone(args.alone) for name, clock in clocks.items()}
    print(f"torch {torch.__version__}, 1 thread, CPU time, {args.arch}, B = {args.batch_size}, "
          f"median of {args.repeats} forwards after {args.warmup} (ms per batch)")
    print("| method | forward | statistics in the network | repeated at once | alone |")
    print("|---|---:|---:|---:|---:|")
    for name, clock in clocks.items():
        t = {key: 1e3 * statistics.median(v) for key, v in
             {**clock.times, "alone": alone[name]}.items()}
        print(f"| {name} | {t['forward']:.1f} | {t['in the network']:.2f} | "
              f"{t['repeated at once']:.2f} | {t['alone']:.2f} |")


if __name__ == "__main__":
    main()
