"""Sensitivity of ``dyn_adaptive``'s constants beside the baselines, with intervals.

Runs the grid's methods (baselines) and, on the same streams, every variant below (``dyn_adaptive``
with the options given, the others as the grid and the dataset set them for ``dyn_adaptive``, or
at its defaults), appending one record per
(dataset, stream, variant, seed) to a JSON-lines file (re-runs skip finished cells), then prints a
Markdown table per (dataset, scenario, batch size): mean accuracy over seeds and the paired batch
bootstrap 95% interval of the difference to ``dyn`` and to the best baseline
(:mod:`dyntta.bench.stats`).

    PYTHONPATH=src python benchmarks/dyn_successor_ablation.py --grid configs/ablation_dyn_successor.toml \
        --data-dir ../shared/data --out runs/ablation.jsonl [--variants nb16 prior8 ...] [--set ...]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json

from pathlib import Path

import numpy as np

from dyntta.bench.config import DatasetEntry, load_grid
from dyntta.bench.report import batches
from dyntta.bench.results import append_record, read_results
from dyntta.bench.runner import (
    STREAM_FIELDS, provenance, rows_fingerprint, run_cell, source_for)
from dyntta.bench.sources import SourceOptions, corrupted_images, resolve_source
from dyntta.bench.stats import (
    difference_interval, percentile_interval, resampled_means, same_batches)
from dyntta.data import make_stream

# the grouping alone: no source, no instance rule, no deep window
GROUPING = {"prior_strength": 1e-6, "balanced_alpha": 0.0, "balance_power": 0.0,
            "instance_k": float("inf"), "deep_window": 0}  # an infinite band keeps no instance
VARIANTS: dict[str, dict] = {  # dyn_adaptive's options: each constant moved, the others kept
    **{f"nb{n}": {"neighbours": n} for n in (16, 32)},
    **{f"prior{n}": {"prior_strength": float(n)} for n in (4, 8)},
    # at B = 64 the neighbourhood layers take the batch, each sample's 64 most similar of the
    # batch and the 192 samples before it, or all 256
    "group-batch": {**GROUPING, "neighbours": 64, "shallow_window": 0},
    "group-64of256": {**GROUPING, "neighbours": 64},
    "group-256": {**GROUPING, "neighbours": 256},
}


def read_labelled(path) -> list[dict]:
    """The records of ``path``, each with its ``variant``: this script's label, or for a record
    of ``dyntta bench`` (no variant; the same cells), its method."""
    return [r if "variant" in r else {**r, "variant": r["config"]["method"]}
            for r in read_results(path)]


def stream_id(config: dict) -> str:
    """The stream and seed of a cell's configuration (``Cell.to_dict()``), without the method
    and without what a run binds to it (model identity, rows), so that a re-run finds it."""
    return json.dumps({k: v for k, v in config.items()
                       if k not in ("method", "options", "source", "rows")}, sort_keys=True)


def dataset_label(dataset: dict) -> str:
    """A grid dataset as a table names it: its kind and, where given, its model's checkpoint
    (two models on the same data are two rows)."""
    model = dataset.get("checkpoint") or dataset.get("model")
    return f"{dataset['name']} {Path(model).stem}" if model else dataset["name"]


def variant_cells(grid, names):
    """(label, cell) for the grid's methods and the named variants of each stream."""
    out, seen = [], set()
    for cell in grid.cells():
        out.append((cell.method, cell))
        stream = dataclasses.replace(cell, method="", options=())
        if stream in seen:
            continue
        seen.add(stream)
        base = {**grid.options.get("dyn_adaptive", {}),
                **cell.dataset.method_options("dyn_adaptive")}
        for name in names:
            opts = tuple(sorted({**base, **VARIANTS[name]}.items()))
            out.append((name, dataclasses.replace(cell, method="dyn_adaptive", options=opts)))
    return out


def marked(difference: float, low: float, high: float) -> str:
    """A difference in points with its 95% interval ``(low, high)``, given as fractions, and
    its mark: ``=`` where the interval holds 0 (a tie), else ``+`` or ``-``."""
    mark = "=" if low <= 0 <= high else ("+" if low > 0 else "-")
    return f"{difference:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] {mark}"


def by_batch_kind(records, options: SourceOptions) -> list[dict]:
    """Each record of a stream that holds batches of one domain and batches that mix domains
    (Random, Shuffle, Wild) as two, one per kind, its scenario labelled with the kind (records
    of other streams left out). The kinds come from the stream the record ran on, planned again
    from its configuration (its rows' fingerprint checked); no model runs."""
    datasets, split = {}, []
    for r in records:
        c = r["config"]
        entry = DatasetEntry(**c["dataset"])
        if entry not in datasets:
            datasets[entry] = corrupted_images(entry, options)[0]
        stream = make_stream(datasets[entry], **{name: c[name] for name in STREAM_FIELDS})
        if rows_fingerprint(stream) != r["rows_fingerprint"]:
            raise ValueError(f"the stream planned here for {c['scenario']} B={c['batch_size']} "
                             f"seed {c['seed']} is not the one its record ran on")
        one = np.array([len(np.unique(p[:, 1])) == 1 for p in stream.plan])
        if one.all() or not one.any():
            continue
        for kind, keep in (("one domain", one), ("mixed", ~one)):
            hits = np.asarray(r["batch_correct"])[keep]
            sizes = np.asarray(r["batch_n"])[keep]
            split.append({**r, "config": {**c, "scenario": f"{c['scenario']}, {kind}"},
                          "batch_correct": hits.tolist(), "batch_n": sizes.tolist(),
                          "accuracy": hits.sum() / sizes.sum()})
    return split


def compact(records, labels, focus):
    """One Markdown row per stream: every label's accuracy (bold: the best and every label tied
    with it), then ``focus`` minus dyn and minus the best other label, with paired 95%
    intervals (``=``: tie, ``+``/``-``: beyond it)."""
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records:
        c = r["config"]
        runs[(dataset_label(c["dataset"]), c["batch_size"], c["scenario"], c["delta"])][
            r["variant"]].append(r)
    shown = [lab for lab in labels if lab != focus]
    lines = ["| dataset | B | scenario | seeds | " + " | ".join(shown) + f" | {focus} | "
             "- dyn | - best other |", "|" + "---|" * (len(shown) + 7)]
    for stream, by in sorted(runs.items(), key=lambda kv: (kv[0][0], -kv[0][1], kv[0][2])):
        if focus not in by:
            continue
        acc = {lab: 100 * np.mean([r["accuracy"] for r in rs]) for lab, rs in by.items()}
        best = max((lab for lab in acc if lab != focus), key=acc.get)

        draws = {}

        def resampled(lab, seeds):
            """``lab``'s runs on ``seeds``: their batch sizes and the bootstrap draws of their
            mean accuracy (drawn once per label: a table compares each label several times)."""
            if (lab, seeds) not in draws:
                rs = sorted((r for r in by[lab] if r["seed"] in seeds), key=lambda r: r["seed"])
                counts = [r["batch_n"] for r in rs]
                draws[lab, seeds] = counts, resampled_means([r["batch_correct"] for r in rs],
                                                            counts)
            return draws[lab, seeds]

        def interval(a, b):  # difference_interval's, paired, with each label's draws reused
            seeds = tuple(sorted({r["seed"] for r in by[a]} & {r["seed"] for r in by[b]}))
            (counts_a, draws_a), (counts_b, draws_b) = resampled(a, seeds), resampled(b, seeds)
            if not same_batches(counts_a, counts_b):
                raise ValueError(f"{a} and {b} ran other batches on {stream}: not paired")
            return percentile_interval(draws_a - draws_b)

        def diff(ref):
            return marked(acc[focus] - acc[ref], *interval(focus, ref))

        top = max(acc, key=acc.get)

        def shown_accuracy(lab):
            low, high = (0.0, 0.0) if lab == top else interval(lab, top)
            text = f"{acc[lab]:.1f}"
            return f"**{text}**" if low <= 0 <= high else text

        seeds = len({r["seed"] for r in by[focus]})
        cells = [shown_accuracy(lab) if lab in acc else "" for lab in shown]
        lines.append(f"| {stream[0]} | {stream[1]} | {stream[2]} | {seeds} | "
                     + " | ".join(cells) + f" | {shown_accuracy(focus)} | "
                     + (diff("dyn") if "dyn" in by else "") + f" | {diff(best)} ({best}) |")
    return "\n".join(lines)


def matrix(records, labels, reference="dyn"):
    """One Markdown row per label, one column per stream: its accuracy minus ``reference``'s
    with the paired 95% interval (``=`` tie, ``+``/``-`` beyond it)."""
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records:
        c = r["config"]
        runs[(dataset_label(c["dataset"]), c["batch_size"], c["scenario"])][r["variant"]].append(r)
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
            cells.append(marked(acc[lab] - acc[reference],
                                *difference_interval(*[batches(rs) for rs in pick])))
        lines.append(f"| {lab} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarise(records, labels):
    """Markdown table per stream: accuracy (mean over seeds) and differences with intervals."""
    runs = collections.defaultdict(dict)
    for r in records:
        c = r["config"]
        stream = (dataset_label(c["dataset"]), c["scenario"], c["batch_size"], c["delta"])
        runs[stream].setdefault(r["variant"], []).append(r)
    lines = []
    for stream, by in sorted(runs.items(), key=lambda kv: tuple(str(v) for v in kv[0])):
        def hits(label, seeds):
            rs = sorted((r for r in by[label] if r["seed"] in seeds), key=lambda r: r["seed"])
            return batches(rs)

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


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", required=True)
    parser.add_argument("--data-dir")
    parser.add_argument("--cache-dir")
    parser.add_argument("--out", required=True, help="JSON-lines results file (this script's, or "
                        "the results.jsonl of a dyntta bench run of the same grid)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--set", nargs="*", default=[], dest="overrides", action="extend",
                        help="override grid fields, KEY=VALUE; repeat or list several")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing; tabulate every record of --out for the grid's "
                        "methods and the variants")
    parser.add_argument("--focus", help="one compact row per stream for this variant")
    parser.add_argument("--matrix", action="store_true",
                        help="one row per variant: its difference to --reference on every stream")
    parser.add_argument("--reference", default="dyn",
                        help="the label --matrix subtracts (default dyn; e.g. successor for a "
                        "sensitivity sweep)")
    parser.add_argument("--batch-kinds", action="store_true",
                        help="each stream that holds both kinds apart: its batches of one "
                        "domain and those that mix domains (Random, Shuffle, Wild)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_arguments(argv)
    grid = load_grid(args.grid, args.overrides)
    options = SourceOptions(args.data_dir, args.cache_dir, severities=(grid.severity,))
    cells = variant_cells(grid, args.variants)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    done = {(stream_id(r["config"]), r["variant"]) for r in read_labelled(args.out)}
    if not args.table_only:
        stamp = provenance(grid)
        for label, cell in cells:
            if (stream_id(cell.to_dict()), label) in done:
                continue
            record = run_cell(cell, source_for(cell, resolve_source, options, True))
            append_record(args.out, {**record, **stamp, "variant": label})
            print(f"{label:28s} {cell.scenario:9s} B={cell.batch_size:<3d} seed={cell.seed} "
                  f"{100 * record['accuracy']:.1f}%  {record['wall_s']:.1f}s", flush=True)
    labels = list(dict.fromkeys(lab for lab, _ in cells))
    if args.table_only:  # every record of the file for these labels (any stream)
        records = [r for r in read_labelled(args.out) if r["variant"] in labels]
    else:
        wanted = {(stream_id(c.to_dict()), lab) for lab, c in cells}
        records = [r for r in read_labelled(args.out)
                   if (stream_id(r["config"]), r["variant"]) in wanted]
    if args.batch_kinds:
        records = by_batch_kind(records, options)
    if args.matrix:
        print(matrix(records, labels, args.reference))
    else:
        print(compact(records, labels, args.focus) if args.focus else summarise(records, labels))


if __name__ == "__main__":
    main()
