"""Two readings of the source's share in ``dyn_adaptive``'s neighbourhood layers, tried and not
adopted (RESULTS.md, "Rules tried and not adopted"): each patches the layers' operator, runs
``dyn_adaptive`` beside its defaults on one stream per (model, scenario), and prints the
difference with its paired 95% interval over the test batches.

- ``empirical-bayes``: on a batch judged one domain, the source counts as N samples with N read
  per layer from the group: the spread of its instance means over the squared shift of their
  mean from the source beyond its noise, ``N = s / max(d - s / n, tiny)`` with ``s`` and ``d``
  averaged over the channels in units of the source variance;
- ``mean-only`` / ``variance-only``: the neighbourhood layers mix the source into the mean only
  (the variance is the group's) or into the variance only;
- ``one-domain-N8`` / ``N4`` / ``N0``: a group judged one domain takes the source as 8, 4 or 0
  samples (``N / (N + n)``) instead of the neighbourhoods' ``prior_strength``.

    PYTHONPATH=src python benchmarks/tried_source_share.py --data-dir ../shared/data \
        --path cifar10-test-jpeg.npz --checkpoint resnet8-mlperf-cifar10.pt \
        --scenarios continual --batch-size 64 --rules empirical-bayes mean-only one-domain-N8
"""

from __future__ import annotations

import argparse

import torch

import dyntta
import dyntta.norm.adaptive as adaptive
from dyntta.bench.config import DatasetEntry
from dyntta.bench.sources import SourceOptions, resolve_source
from dyntta.bench.stats import difference_interval
from dyntta.data import make_stream
from dyntta.norm.mixing import size_weight

RULES = ("empirical-bayes", "mean-only", "variance-only", "one-domain-N8", "one-domain-N4",
         "one-domain-N0")
_operator = adaptive._neighbourhood_operator
_source_mixed = adaptive.source_mixed
ACTIVE: set[str] = set()


def empirical_bayes_strength(group: torch.Tensor, running_mean: torch.Tensor,
                             running_var: torch.Tensor, eps: float) -> float:
    """N = s / (d - s / n) for the group's (n, C) instance means (channels in units of the
    source variance): ``s`` their mean spread, ``d`` their mean's squared shift from the
    source."""
    n, scale = group.shape[0], running_var + eps
    spread = (group.var(0) / scale).mean() if n > 1 else group.new_zeros(())
    shift = ((group.mean(0) - running_mean).square() / scale).mean()
    return float(spread / (shift - spread / n).clamp_min(1e-12))


def operator(mu, s2, window_mean, window_var, n_window, window, domain_rows, running_mean,
             running_var, neighbours, candidates, prior_strength, length, k, c, eps):
    rows = int(domain_rows)
    one_domain = [rule for rule in ACTIVE if rule.startswith("one-domain-N")]
    if rows and ("empirical-bayes" in ACTIVE or one_domain):
        pool_mu, pool_s2 = adaptive.pool_of(mu, s2, window_mean, window_var, n_window)
        if one_domain:
            strength = float(one_domain[0].removeprefix("one-domain-N"))
        else:
            strength = empirical_bayes_strength(pool_mu[-rows:], running_mean, running_var, eps)
        weight = size_weight(rows, strength) if strength > 0 else 0.0
        mean, var = adaptive.pooled_statistics(
            mu, s2, pool_mu[-rows:], pool_s2[-rows:], mu.new_ones(rows), running_mean,
            running_var, weight, length, k, c, eps)
        return (mean.expand_as(mu).clone(), var.expand_as(mu).clone(),
                *adaptive.next_window(pool_mu, pool_s2, window))
    return _operator(mu, s2, window_mean, window_var, n_window, window, domain_rows,
                     running_mean, running_var, neighbours, candidates, prior_strength, length,
                     k, c, eps)


def source_mixed(mu, s2, mean, var, spread, weight, running_mean, running_var, length, k, c,
                 eps):
    """The neighbourhood layers pass a float weight, the pooling layers a tensor: only the
    former change."""
    if isinstance(weight, torch.Tensor) or not ACTIVE & {"mean-only", "variance-only"}:
        return _source_mixed(mu, s2, mean, var, spread, weight, running_mean, running_var,
                             length, k, c, eps)
    mean_weight = 0.0 if "variance-only" in ACTIVE else weight
    var_weight = 0.0 if "mean-only" in ACTIVE else weight
    mean = adaptive.mix(running_mean, mean, mean_weight)
    var = adaptive.mix(running_var, var, var_weight)
    if k is not None and length > 1:
        mean, var = adaptive.widened_instance_rule(mu, s2, mean, var, spread, length, k, c,
                                                   eps)
    return mean, var


adaptive.NeighbourhoodNorm2d.operator = staticmethod(operator)
adaptive.source_mixed = source_mixed


def hits(model, stream, rule: str | None) -> tuple[list[int], list[int]]:
    """Correct predictions and images per batch of ``dyn_adaptive`` under ``rule``."""
    ACTIVE.clear()
    ACTIVE.update({rule} if rule else set())
    method = dyntta.adapt(model, "dyn_adaptive")
    correct, counts = [], []
    with torch.no_grad():
        for batch in stream:
            correct.append(int((method(batch.x).argmax(1) == batch.y).sum()))
            counts.append(len(batch.y))
    return correct, counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--model", default=None, help="module:factory of the architecture")
    parser.add_argument("--scenarios", nargs="+", default=["continual"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rules", nargs="+", choices=RULES, default=list(RULES))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    entry = DatasetEntry("npz", args.path, args.checkpoint, model=args.model)
    source = resolve_source(entry, SourceOptions(args.data_dir, None, severities=(5,)), False)
    for scenario in args.scenarios:
        stream = list(make_stream(source.dataset, n_domains=15, severity=5, scenario=scenario,
                                  batch_size=args.batch_size, seed=args.seed, n_samples=100,
                                  delta=0.1 if scenario == "wild" else None))
        default = hits(source.model, stream, None)
        for rule in args.rules:
            tried = hits(source.model, stream, rule)
            low, high = difference_interval(([tried[0]], [tried[1]]), ([default[0]], [default[1]]))
            gain = 100 * (sum(tried[0]) - sum(default[0])) / sum(default[1])
            print(f"{scenario} B={args.batch_size} {rule}: {gain:+.1f} "
                  f"[{100 * low:+.1f}, {100 * high:+.1f}] (defaults "
                  f"{100 * sum(default[0]) / sum(default[1]):.1f})", flush=True)


if __name__ == "__main__":
    main()
