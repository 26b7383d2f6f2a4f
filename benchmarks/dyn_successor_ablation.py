"""Ablation of the cluster-aware layer's options beyond the paper, with intervals.

Runs the grid's methods (baselines) and, on the same streams, every variant below (``dyn_adaptive``
with the options given: each option alone, then combinations), appending one record per
(dataset, stream, variant, seed) to a JSON-lines file (re-runs skip finished cells), then prints a
Markdown table per (dataset, scenario, batch size): mean accuracy over seeds and the paired batch
bootstrap 95% interval of the difference to ``dyn`` and to the best baseline
(:mod:`dyntta.bench.stats`).

    PYTHONPATH=src python benchmarks/dyn_successor_ablation.py --grid configs/ablation_dyn_successor.toml \
        --data-dir ../shared/data --out runs/ablation.jsonl [--variants size merge1 ...] [--set ...]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json

from pathlib import Path

import numpy as np

from dyntta.bench.config import load_grid
from dyntta.bench.results import append_record, read_results
from dyntta.bench.runner import run_cell, source_for
from dyntta.bench.sources import SourceOptions, resolve_source
from dyntta.bench.stats import difference_interval

DYN_OPTIONS = {"merge_levels": 0, "neighbours": 0, "source_weight": "fixed",
               "prior_strength": 16.0, "instance_k": None, "instance_spread": None,
               "spread_per": "layer", "instance_around": "mixed", "cluster_fraction": 1.0,
               "deep_source_weight": "same", "balanced_alpha": 0.4, "balance_power": 2.0,
               "instance_fraction": 1.0, "window": 0, "shallow_window": None,
               "deep_window": None, "deep_match": None, "deep_match_reference": "pool",
               "deep_balance": None,
               "top_up": False}
"""dyn_adaptive with these options is dyn; every variant states all of them (its label means the
same whatever dyn_adaptive's defaults are)."""


def variant(**changes) -> dict:
    return {**DYN_OPTIONS, **changes}


VARIANTS: dict[str, dict] = {
    # one option at a time (the others as in dyn)
    "merge1": variant(merge_levels=1),
    "merge2": variant(merge_levels=2),
    "size16": variant(source_weight="size"),
    "shift": variant(source_weight="shift"),
    "iabn4": variant(instance_k=4.0),
    "shallow50": variant(cluster_fraction=0.5),
    "window64": variant(window=64),
    # combinations
    "merge1+size16": variant(merge_levels=1, source_weight="size"),
    "size16+shallow50": variant(source_weight="size", cluster_fraction=0.5),
    "merge1+size16+shallow50": variant(merge_levels=1, source_weight="size",
                                       cluster_fraction=0.5),
    "size16+window64": variant(source_weight="size", window=64),
    "size16+iabn4": variant(source_weight="size", instance_k=4.0),
    "size16+shallow50+deepfixed": variant(source_weight="size", cluster_fraction=0.5,
                                          deep_source_weight="fixed"),
    "size16+shallow50+deepfixed+iabn8": variant(source_weight="size", cluster_fraction=0.5,
                                                deep_source_weight="fixed", instance_k=8.0),
    # dyn_adaptive's defaults until LISC gave way to neighbourhoods (then successor-nb8)
    "successor": variant(source_weight="size", cluster_fraction=0.5, deep_source_weight="fixed",
                         instance_k=16.0, window=64, top_up=True),
    "size16+shallow50+deepfixed+window64": variant(source_weight="size", cluster_fraction=0.5,
                                                   deep_source_weight="fixed", window=64),
    "size16+shallow50+deepfixed+iabn8+window64": variant(
        source_weight="size", cluster_fraction=0.5, deep_source_weight="fixed", instance_k=8.0,
        window=64),
}
SWEEPS: dict[str, dict] = {  # sensitivity of each constant, the others as in dyn
    **{f"size{n}": variant(source_weight="size", prior_strength=float(n)) for n in (4, 8, 32, 64)},
    **{f"shallow{round(100 * f)}": variant(cluster_fraction=f) for f in (0.25, 0.75)},
    **{f"window{w}": variant(window=w) for w in (16, 256)},
    **{f"iabn{k}": variant(instance_k=float(k)) for k in (2, 8)},
}
SUCCESSOR = VARIANTS["successor"]
SWEEPS.update({  # each constant of the successor, the others at its defaults
    **{f"successor-size{n}": {**SUCCESSOR, "prior_strength": float(n)} for n in (8, 32)},
    **{f"successor-shallow{round(100 * f)}": {**SUCCESSOR, "cluster_fraction": f}
       for f in (0.25, 0.75)},
    **{f"successor-iabn{k}": {**SUCCESSOR, "instance_k": float(k)} for k in (4, 8, 32)},
    **{f"successor-fill{w}": {**SUCCESSOR, "window": w} for w in (16, 32, 128)},
    "successor-iabnshallow": {**SUCCESSOR, "instance_fraction": 0.5},
    "successor-noiabn": {**SUCCESSOR, "instance_k": None},
    "successor-nofill": {**SUCCESSOR, "window": 0},
    **{f"successor-deep{w}": {**SUCCESSOR, "deep_source_weight": w} for w in ("size", "shift")},
    "successor-alpha0.7": {**SUCCESSOR, "alpha": 0.7},
    "successor-alpha0.9": {**SUCCESSOR, "alpha": 0.9},
    # LISC clusters replaced by each sample's n nearest samples (n = 8: dyn_adaptive's defaults)
    **{f"successor-nb{n}": {**SUCCESSOR, "neighbours": n} for n in (4, 6, 8, 12, 16, 32)},
})
ADAPTIVE = SWEEPS["successor-nb8"]  # dyn_adaptive's first defaults
SWEEPS.update({  # each other constant of dyn_adaptive's defaults, the rest at those defaults
    **{f"nb8-size{n}": {**ADAPTIVE, "prior_strength": float(n)} for n in (8, 32)},
    **{f"nb8-shallow{round(100 * f)}": {**ADAPTIVE, "cluster_fraction": f}
       for f in (0.25, 0.75)},
    **{f"nb8-iabn{k}": {**ADAPTIVE, "instance_k": float(k)} for k in (8, 32)},
    "nb8-noiabn": {**ADAPTIVE, "instance_k": None},
    **{f"nb8-fill{w}": {**ADAPTIVE, "window": w} for w in (32, 128)},
    "nb8-nofill": {**ADAPTIVE, "window": 0},
    **{f"nb8-alpha{a}": {**ADAPTIVE, "alpha": a} for a in (0.7, 0.9)},
    **{f"nb8-deep{w}": {**ADAPTIVE, "deep_source_weight": w} for w in ("size", "shift")},
    **{f"nb8-deepwin{w}": {**ADAPTIVE, "deep_window": w} for w in (128, 256, 512)},
    # the deep window kept to the samples that match the current pool (quantile q, in percent)
    **{f"nb8-deepwin{w}-match{q}": {**ADAPTIVE, "deep_window": w, "deep_match": q / 100}
       for w in (256, 512) for q in (0, 10, 25, 50)},
    # the instance rule's band widened to c standard deviations of the observed instance means
    **{f"nb8-k{k}-spread{c}": {**ADAPTIVE, "instance_k": float(k), "instance_spread": c}
       for k in (4, 6, 8, 16) for c in (1.5, 2, 2.5, 3, 4)},
    **{f"nb8-deepwin256{m}-k8-spread2.5": {**ADAPTIVE, "deep_window": 256, "deep_match": q,
                                           "instance_k": 8.0, "instance_spread": 2.5}
       for m, q in (("", None), ("-match10", 0.1))},
    # the deep window kept class-balanced by the predictions (n per class), after the match
    **{f"nb8-k8-spread{c}-deep{w}-match10-bal{n}": {
        **ADAPTIVE, "instance_k": 8.0, "instance_spread": c, "deep_window": w,
        "deep_match": 0.1, "deep_balance": n}
       for c in (2.5, 3) for w in (256, 512, 1024) for n in (8, 16, 32, 64)},
    **{f"nb8-k8-spread2.5-deep{w}-bal{n}": {
        **ADAPTIVE, "instance_k": 8.0, "instance_spread": 2.5, "deep_window": w,
        "deep_balance": n} for w in (512, 1024) for n in (16, 32, 64)},
})
DEFAULTS = SWEEPS["nb8-k8-spread2.5-deep512-match10-bal32"]  # the defaults before the label rule
SWEEPS.update({  # the deep layers' source weight beside the class-balanced deep window
    **{f"bal-alpha{a}": {**DEFAULTS, "alpha": a} for a in (0.4, 0.5, 0.6, 0.7, 0.9)},
    **{f"bal-deep{w}": {**DEFAULTS, "deep_source_weight": w} for w in ("size", "shift")},
    # ... and following the label balance of the last 64 predictions (weight a for even classes,
    # power p)
    **{f"labels-a{a}-p{p}": {**DEFAULTS, "deep_source_weight": "labels", "balanced_alpha": a,
                             "balance_power": float(p)}
       for a in (0.2, 0.4, 0.5, 0.6) for p in (1, 2, 3)},
})
LABELS = SWEEPS["labels-a0.4-p2"]  # the defaults before the per-channel band
SWEEPS.update({
    "labels-deep256": {**LABELS, "deep_window": 256},
    # the instance rule off, in the clustering layers only, at k = 16, at c = 4
    "labels-noiabn": {**LABELS, "instance_k": None},
    "labels-iabnshallow": {**LABELS, "instance_fraction": 0.5},
    "labels-k16": {**LABELS, "instance_k": 16.0},
    "labels-spread4": {**LABELS, "instance_spread": 4.0},
    # the deep window judged against the batch alone (not the topped-up pool)
    "labels-matchbatch": {**LABELS, "deep_match_reference": "batch"},
    # the instance rule around the group's own statistics, before the source is mixed in
    "labels-aro": {**LABELS, "instance_around": "cluster"},
    # the instance rule's band per channel, c observed deviations
    **{f"labels-spc{c:g}": {**LABELS, "spread_per": "channel", "instance_spread": c}
       for c in (2.0, 2.5, 3.0)},
    # a longer window in the clustering layers
    **{f"labels-sw{w}": {**LABELS, "shallow_window": w} for w in (128, 256)},
    # both: spc2.5-sw256 became dyn_adaptive's defaults
    **{f"labels-spc{c:g}-sw{w}": {**LABELS, "spread_per": "channel", "instance_spread": c,
                                "shallow_window": w}
       for c in (1.5, 2.0, 2.5, 3.0) for w in (128, 256, 512)},
})
BAND = SWEEPS["labels-spc2.5-sw256"]  # the defaults before the instance rule left the deep layers
SWEEPS.update({  # the shallow source weight (N / (N + 8)), with the rule around the group
    **{f"band-size{n}": {**BAND, "prior_strength": float(n)} for n in (8, 32)},
    **{f"band-aro-size{n}": {**BAND, "instance_around": "cluster", "prior_strength": float(n)}
       for n in (4, 8, 16)},
    # the instance rule in the first fraction f of the BN layers only; the variances mixed
    # geometrically on top
    **{f"band-if{f:g}": {**BAND, "instance_fraction": f} for f in (0.1, 0.15, 0.25)},
    "band-if0.25-logmix": {**BAND, "instance_fraction": 0.25, "mix": "log"},
})
VARIANTS.update(SWEEPS)


def stream_id(config: dict) -> str:
    """The stream and seed of a cell's configuration (``Cell.to_dict()``), without the method."""
    return json.dumps({k: v for k, v in config.items() if k not in ("method", "options")},
                      sort_keys=True)


def variant_cells(grid, names):
    """(label, cell) for the grid's methods and the named variants of each stream."""
    out, seen = [], set()
    for cell in grid.cells():
        out.append((cell.method, cell))
        stream = dataclasses.replace(cell, method="", options=())
        if stream in seen:
            continue
        seen.add(stream)
        for name in names:
            opts = tuple(sorted(VARIANTS[name].items()))
            out.append((name, dataclasses.replace(cell, method="dyn_adaptive", options=opts)))
    return out


def compact(records, labels, focus):
    """One Markdown row per stream: every label's accuracy, then ``focus`` minus dyn and minus
    the best other label, with paired 95% intervals (``=``: tie, ``+``/``-``: beyond it)."""
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records:
        c = r["config"]
        runs[(c["dataset"]["name"], c["batch_size"], c["scenario"], c["delta"])][
            r["variant"]].append(r)
    shown = [lab for lab in labels if lab != focus]
    lines = ["| dataset | B | scenario | seeds | " + " | ".join(shown) + f" | {focus} | "
             "- dyn | - best other |", "|" + "---|" * (len(shown) + 7)]
    for stream, by in sorted(runs.items(), key=lambda kv: (kv[0][0], -kv[0][1], kv[0][2])):
        if focus not in by:
            continue
        acc = {lab: 100 * np.mean([r["accuracy"] for r in rs]) for lab, rs in by.items()}
        best = max((lab for lab in acc if lab != focus), key=acc.get)

        def diff(ref):
            seeds = {r["seed"] for r in by[focus]} & {r["seed"] for r in by[ref]}
            pick = [sorted((r for r in by[lab] if r["seed"] in seeds), key=lambda r: r["seed"])
                    for lab in (focus, ref)]
            low, high = difference_interval(*[([r["batch_correct"] for r in rs],
                                               [r["batch_n"] for r in rs]) for rs in pick])
            mark = "=" if low <= 0 <= high else ("+" if low > 0 else "-")
            return f"{acc[focus] - acc[ref]:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] {mark}"

        seeds = len({r["seed"] for r in by[focus]})
        cells = [f"{acc[lab]:.1f}" if lab in acc else "" for lab in shown]
        lines.append(f"| {stream[0]} | {stream[1]} | {stream[2]} | {seeds} | "
                     + " | ".join(cells) + f" | **{acc[focus]:.1f}** | "
                     + (diff("dyn") if "dyn" in by else "") + f" | {diff(best)} ({best}) |")
    return "\n".join(lines)


def matrix(records, labels, reference="dyn"):
    """One Markdown row per label, one column per stream: its accuracy minus ``reference``'s
    with the paired 95% interval (``=`` tie, ``+``/``-`` beyond it)."""
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records:
        c = r["config"]
        runs[(c["dataset"]["name"], c["batch_size"], c["scenario"])][r["variant"]].append(r)
    streams = sorted(runs, key=lambda k: (k[0], -k[1], k[2]))
    lines = ["| variant | " + " | ".join(f"{d} B={b} {s}" for d, b, s in streams) + " |",
             "|---|" + "---|" * len(streams)]
    for lab in labels:
        cells = []
        for stream in streams:
            by = runs[stream]
            if lab not in by or reference not in by:
                cells.append("")
                continue
            acc = {k: 100 * np.mean([r["accuracy"] for r in by[k]]) for k in (lab, reference)}
            if lab == reference:
                cells.append(f"{acc[reference]:.1f}")
                continue
            seeds = {r["seed"] for r in by[lab]} & {r["seed"] for r in by[reference]}
            pick = [sorted((r for r in by[k] if r["seed"] in seeds), key=lambda r: r["seed"])
                    for k in (lab, reference)]
            low, high = difference_interval(*[([r["batch_correct"] for r in rs],
                                               [r["batch_n"] for r in rs]) for rs in pick])
            mark = "=" if low <= 0 <= high else ("+" if low > 0 else "-")
            cells.append(f"{acc[lab] - acc[reference]:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] "
                         f"{mark}")
        lines.append(f"| {lab} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarise(records, labels):
    """Markdown table per stream: accuracy (mean over seeds) and differences with intervals."""
    runs = collections.defaultdict(dict)
    for r in records:
        c = r["config"]
        stream = (c["dataset"]["name"], c["scenario"], c["batch_size"], c["delta"])
        runs[stream].setdefault(r["variant"], []).append(r)
    lines = []
    for stream, by in sorted(runs.items(), key=lambda kv: tuple(str(v) for v in kv[0])):
        def hits(label, seeds):
            rs = sorted((r for r in by[label] if r["seed"] in seeds), key=lambda r: r["seed"])
            return [r["batch_correct"] for r in rs], [r["batch_n"] for r in rs]

        acc = {lab: 100 * np.mean([r["accuracy"] for r in rs]) for lab, rs in by.items()}
        baselines = [lab for lab in acc if lab not in VARIANTS]
        best = max(baselines, key=acc.get)
        lines += [f"\n{stream[0]} {stream[1]} B={stream[2]}"
                  + (f" delta={stream[3]}" if stream[3] is not None else "")
                  + f", seeds {sorted({r['seed'] for r in by[best]})}; best baseline {best}",
                  "| method | acc % | vs dyn (95% CI) | vs best baseline (95% CI) |",
                  "|---|---|---|---|"]
        for lab in [x for x in labels if x in acc]:
            cells = []
            for ref in ("dyn", best):
                if ref not in by or ref == lab:
                    cells.append("")
                    continue
                seeds = {r["seed"] for r in by[lab]} & {r["seed"] for r in by[ref]}
                low, high = difference_interval(hits(lab, seeds), hits(ref, seeds))
                mark = "tie" if low <= 0 <= high else ("better" if low > 0 else "worse")
                cells.append(f"{acc[lab] - acc[ref]:+.1f} "
                             f"[{100 * low:+.1f}, {100 * high:+.1f}] {mark}")
            lines.append(f"| {lab} | {acc[lab]:.1f} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", required=True)
    parser.add_argument("--data-dir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--out", required=True, help="JSON-lines results file")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--set", nargs="*", default=[], dest="overrides")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing; tabulate every record of --out for the grid's "
                        "methods and the variants")
    parser.add_argument("--focus", help="one compact row per stream for this variant")
    parser.add_argument("--matrix", action="store_true",
                        help="one row per variant: its difference to --reference on every stream")
    parser.add_argument("--reference", default="dyn",
                        help="the label --matrix subtracts (default dyn; e.g. successor for a "
                        "sensitivity sweep)")
    args = parser.parse_args(argv)
    grid = load_grid(args.grid, args.overrides)
    options = SourceOptions(args.data_dir, args.cache_dir, severities=(grid.severity,))
    cells = variant_cells(grid, args.variants)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    done = {(stream_id(r["config"]), r["variant"]) for r in read_results(args.out)}
    if not args.table_only:
        for label, cell in cells:
            if (stream_id(cell.to_dict()), label) in done:
                continue
            record = run_cell(cell, source_for(cell, resolve_source, options, True))
            append_record(args.out, {**record, "variant": label})
            print(f"{label:28s} {cell.scenario:9s} B={cell.batch_size:<3d} seed={cell.seed} "
                  f"{100 * record['accuracy']:.1f}%  {record['wall_s']:.1f}s", flush=True)
    labels = list(dict.fromkeys(lab for lab, _ in cells))
    if args.table_only:  # every record of the file for these labels (any stream)
        records = [r for r in read_results(args.out) if r["variant"] in labels]
    else:
        wanted = {(stream_id(c.to_dict()), lab) for lab, c in cells}
        records = [r for r in read_results(args.out)
                   if (stream_id(r["config"]), r["variant"]) in wanted]
    if args.matrix:
        print(matrix(records, labels, args.reference))
    else:
        print(compact(records, labels, args.focus) if args.focus else summarise(records, labels))


if __name__ == "__main__":
    main()
