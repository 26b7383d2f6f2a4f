"""Tables and plots rendered from a results file alone.

The table follows the paper's Table 1: methods as rows, grouped into test-time fine-tuning
(methods that take a backward pass) and test-time normalisation; columns are the combinations of
the configuration fields that vary across the records (dataset x scenario for Table 1, batch
size, number of domains, delta, rounds ...); a last column averages them. Accuracies are in %,
each as ``mean ± h`` with ``h`` half the width of its 95% interval (:mod:`dyntta.bench.stats`:
a bootstrap over test batches for one seed, Student's t over seeds for several). In every
column the best method and every method statistically tied with it are in bold (a paired
bootstrap test of the difference, see :mod:`dyntta.bench.stats`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from dyntta.atomic import write_atomic, write_figure
from dyntta.bench.config import COLUMN_KEYS
from dyntta.bench.stats import bootstrap_interval, difference_interval, seed_interval
from dyntta.methods import method_class

GROUPS = ("Source", "Test-time fine-tuning", "Test-time normalisation",
          "Not known to this version of dyntta")


def check_records(records: list[dict[str, Any]]) -> None:
    """Raise ``ValueError`` naming the first record that is not a ``dyntta bench`` result."""
    if not records:
        raise ValueError("no records to report")
    for i, r in enumerate(records, 1):
        try:
            check_record(r)
        except ValueError as exc:
            raise ValueError(f"record {i}: {exc}") from None


def check_record(record: Any) -> None:
    """Raise ``ValueError`` naming the first field of ``record`` that a table cannot use or
    that no run can produce (an accuracy outside [0, 1], hits beyond a batch's size ...)."""
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object: {brief(record)}")
    config = record.get("config")
    if not isinstance(config, dict) or not config:
        raise ValueError(f"config must be a non-empty object, got {brief(config)}: not a "
                         "result of dyntta bench")
    dataset = config.get("dataset")
    if not isinstance(dataset, dict) or not isinstance(dataset.get("name"), str):
        raise ValueError(f"config.dataset must be an object with a name, got {brief(dataset)}")
    for field, kind in (("method", str), ("scenario", str), ("batch_size", int),
                        ("n_domains", int), ("rounds", int), ("severity", int), ("seed", int)):
        value = config.get(field)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if kind is int
                                                     else str):
            raise ValueError(f"config.{field} must be {'a string' if kind is str else 'an integer'}"
                             f", got {brief(value)}")
    if config.get("delta") is not None and not is_number(config["delta"]):
        raise ValueError(f"config.delta must be a number or null, got {brief(config['delta'])}")
    if not isinstance(config.get("options", {}), dict):
        raise ValueError(f"config.options must be an object, got {brief(config['options'])}")
    if not is_fraction(record.get("accuracy")):
        raise ValueError(f"accuracy must be a number in [0, 1] (a fraction, not %), got "
                         f"{brief(record.get('accuracy'))}")
    per_domain = record.get("per_domain", {})
    if not isinstance(per_domain, dict) or not all(map(is_fraction, per_domain.values())):
        raise ValueError(f"per_domain must map domains to numbers in [0, 1], got "
                         f"{brief(per_domain)}")
    if "batch_correct" in record or "batch_n" in record:
        check_batches(record.get("batch_correct"), record.get("batch_n"), record["accuracy"])


def check_batches(hits: Any, sizes: Any, accuracy: float) -> None:
    """Per-batch hits and sizes: equal-length lists of integers, ``0 <= hits <= size``, whose
    ratio of sums is ``accuracy``."""
    if not (isinstance(hits, list) and isinstance(sizes, list) and hits
            and len(hits) == len(sizes)
            and all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                    for v in hits + sizes)):
        raise ValueError(f"batch_correct and batch_n must be equal-length lists of integers, got "
                         f"{brief(hits)} and {brief(sizes)}")
    if any(n < 1 or not 0 <= c <= n for c, n in zip(hits, sizes)):
        raise ValueError("batch_correct must lie within 0..batch_n, batch by batch")
    if not math.isclose(sum(hits) / sum(sizes), accuracy, abs_tol=1e-9):
        raise ValueError(f"accuracy {accuracy} is not the batches' {sum(hits)} / {sum(sizes)}")


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and \
        math.isfinite(value)


def is_fraction(value: Any) -> bool:
    return is_number(value) and 0.0 <= value <= 1.0


def brief(value: Any, width: int = 60) -> str:
    """``repr(value)``, cut to ``width`` characters."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def method_label(config: dict[str, Any]) -> str:
    options = config.get("options") or {}
    if not options:
        return config["method"]
    return config["method"] + "(" + ", ".join(f"{k}={v}" for k, v in sorted(options.items())) + ")"


def column_value(config: dict[str, Any], field: str) -> Any:
    return config["dataset"]["name"] if field == "dataset" else config[field]


def varying_columns(records: list[dict[str, Any]]) -> list[str]:
    """The configuration fields (in ``COLUMN_KEYS`` order) that take several values."""
    cols = [f for f in COLUMN_KEYS
            if len({json.dumps(column_value(r["config"], f)) for r in records}) > 1]
    return cols or ["dataset"]


def group_of(method: str) -> str:
    if method == "source":
        return GROUPS[0]
    try:
        backward = method_class(method).backward
    except ValueError:  # a method of another version of dyntta: kept, in a group of its own
        return GROUPS[3]
    return GROUPS[1] if backward else GROUPS[2]


def row_fields(records: list[dict[str, Any]], columns: list[str]) -> list[str]:
    """The configuration fields besides the method, its options, the seed and the columns that
    take several values (``protocol``, ``compile``, ``n_samples`` ...): they name separate rows,
    so runs that differ in them are never averaged as seeds of one cell."""
    skip = {"method", "options", "seed", *columns}
    fields = sorted({f for r in records for f in r["config"]} - skip)
    return [f for f in fields
            if len({json.dumps(r["config"].get(f), sort_keys=True) for r in records}) > 1]


def row_label(config: dict[str, Any], fields: list[str], short: dict[str, str] | None = None
              ) -> str:
    """The method's label, followed by the values of ``fields`` (see :func:`row_fields`);
    ``short`` names a value's JSON by something shorter (:func:`short_sources`)."""
    short = short or {}
    extra = ", ".join(f"{f}={short.get(text, text)}" for f in fields
                      for text in [json.dumps(config.get(f), sort_keys=True)])
    return method_label(config) + (f" [{extra}]" if extra else "")


def short_sources(records: list[dict[str, Any]]) -> dict[str, str]:
    """Each model and data (``source``) by its model's name, where those names tell every
    source of the records apart (else none: the rows show them whole)."""
    names = {json.dumps(r["config"].get("source"), sort_keys=True):
             (r["config"].get("source") or {}).get("model")
             or (r["config"].get("source") or {}).get("model_factory") for r in records}
    values = list(names.values())
    return names if None not in values and len(set(values)) == len(values) else {}


def aggregate(records: list[dict[str, Any]], columns: list[str]) -> dict:
    """``{(row_label, column_tuple): [record per seed, by seed]}``; a ``ValueError`` if two
    records of one cell share a seed (nothing in their configurations tells them apart)."""
    fields, short = row_fields(records, columns), short_sources(records)
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        c = r["config"]
        cells[(row_label(c, fields, short), tuple(column_value(c, f) for f in columns))].append(r)
    for (label, key), runs in cells.items():
        runs.sort(key=lambda r: r["config"].get("seed", 0))
        seeds = [r["config"].get("seed", 0) for r in runs]
        if len(set(seeds)) < len(seeds):
            raise ValueError(f"{label} at {' / '.join(map(str, key))}: several records of one "
                             "seed with configurations the table cannot tell apart (results "
                             "without cell keys?); report them from separate results files")
    return cells


def has_batches(runs: list[dict]) -> bool:
    return all("batch_correct" in r and "batch_n" in r for r in runs)


def batches(runs: list[dict]) -> tuple[list, list]:
    return [r["batch_correct"] for r in runs], [r["batch_n"] for r in runs]


MIN_BATCHES = 10
"""Fewer test batches than this in a run: a bootstrap over them is no interval (3 batches of
64 gave ± 0.9 points where the binomial interval over their 192 images is about ± 7), and no
paired test can tell ties, so such a cell shows no interval and its column marks no best."""


def few_batches(runs: list[dict]) -> bool:
    """Whether some run has per-batch data with fewer than :data:`MIN_BATCHES` batches."""
    return any(len(r["batch_n"]) < MIN_BATCHES for r in runs if "batch_n" in r)


def interval(runs: list[dict]) -> tuple[float, float, str] | None:
    """95% interval of the mean accuracy of ``runs`` (one per seed), and how it was made; None
    for one run without batches or with fewer than :data:`MIN_BATCHES` of them."""
    if len(runs) > 1:
        return (*seed_interval([r["accuracy"] for r in runs]), "t over seeds")
    if has_batches(runs) and not few_batches(runs):
        return (*bootstrap_interval(*(v[0] for v in batches(runs))), "bootstrap over batches")
    return None


def same_streams(a: list[dict], b: list[dict]) -> bool:
    """Whether two methods' runs tested on the same rows in the same batches, seed by seed."""
    def streams(runs):
        return [(r["config"].get("seed"), r.get("rows_fingerprint"), r["batch_n"]) for r in runs]
    return all("rows_fingerprint" in r for r in a + b) and streams(a) == streams(b)


def tied(best: list[dict], other: list[dict]) -> bool:
    """Whether ``other``'s mean accuracy is statistically indistinguishable from ``best``'s
    (the 95% interval of their difference contains 0; equal means without batch data)."""
    if not (has_batches(best) and has_batches(other)):
        return bool(np.isclose(mean_accuracy(best), mean_accuracy(other)))
    low, _ = difference_interval(batches(best), batches(other), paired=same_streams(best, other))
    return low <= 0


def mean_accuracy(runs: list[dict]) -> float:
    return float(np.mean([r["accuracy"] for r in runs]))


def percent(runs: list[dict]) -> str:
    """``mean ± h`` of ``runs``; without an interval the mean alone, with ``(n batches)`` when
    there were too few batches for one."""
    text = f"{100 * mean_accuracy(runs):.1f}"
    bounds = interval(runs)
    if bounds is not None:
        return f"{text} ± {50 * (bounds[1] - bounds[0]):.1f}"
    if len(runs) == 1 and few_batches(runs):
        return f"{text} ({len(runs[0]['batch_n'])} batches)"
    return text


def table(records: list[dict[str, Any]], columns: list[str] | None = None) -> tuple[str, str]:
    """The Markdown table and the CSV (long format) of ``records``."""
    check_records(records)
    columns = list(columns or varying_columns(records))
    cells = aggregate(records, columns)
    group = {m: group_of(runs[0]["config"]["method"]) for (m, _), runs in cells.items()}
    methods = sorted(group, key=lambda m: (GROUPS.index(group[m]), m))
    keys = sorted({k for _, k in cells}, key=lambda k: json.dumps(k))
    best = {k: max((m for m in methods if (m, k) in cells),
                   key=lambda m: mean_accuracy(cells[(m, k)])) for k in keys}
    judged = {k for k in keys if not any(few_batches(cells[(m, k)]) for m in methods
                                         if (m, k) in cells)}
    bold = {(m, k) for (m, k), runs in cells.items()
            if k in judged and tied(cells[(best[k], k)], runs)}
    complete = [m for m in methods if all((m, k) in cells for k in keys)]
    # the average column: every (column, seed) run of a method, so the same machinery applies
    overall = {m: [r for k in keys for r in cells[(m, k)]] for m in complete}
    top = max(complete, key=lambda m: mean_accuracy(overall[m]), default=None)
    n_images = sorted({r.get("n_samples") for r in records}, key=str)
    n_seeds = sorted({len(runs) for runs in cells.values()})
    header = ["method", *[" / ".join(str(v) for v in k) for k in keys], "avg"]
    lines = [f"columns: {' / '.join(columns)}; accuracy (%) ± half-width of its 95% interval; "
             f"bold: the best and every method tied with it (not in a column with a run of "
             f"fewer than {MIN_BATCHES} test batches: no interval there); test images per run: "
             f"{', '.join(map(str, n_images))}; seeds per cell: {', '.join(map(str, n_seeds))}",
             "", "| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    current = None
    for m in methods:
        if group[m] != current:
            current = group[m]
            lines.append(f"| *{current}* |" + " |" * (len(header) - 1))
        row = [m]
        for k in keys:
            if (m, k) not in cells:
                row.append("–")
                continue
            text = percent(cells[(m, k)])
            row.append(f"**{text}**" if (m, k) in bold else text)
        if m not in overall:
            row.append("–")
        else:
            text = f"{100 * mean_accuracy(overall[m]):.1f}"
            judge = not any(few_batches(runs) for runs in overall.values())
            row.append(f"**{text}**" if judge and tied(overall[top], overall[m]) else text)
        lines.append("| " + " | ".join(row) + " |")
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["method", "group", *columns, "accuracy_mean", "ci_low", "ci_high",
                     "interval", "n_seeds", "n_samples", "tied_with_best"])
    for (m, k), runs in sorted(cells.items(), key=lambda item: json.dumps(item[0])):
        low, high, how = interval(runs) or (
            None, None, f"none (fewer than {MIN_BATCHES} batches)" if few_batches(runs) else "none")
        writer.writerow([m, group[m], *k, mean_accuracy(runs), low, high, how,
                         len(runs), sum(r.get("n_samples", 0) for r in runs), (m, k) in bold])
    return "\n".join(lines) + "\n", buf.getvalue()


def plot_against(records: list[dict[str, Any]], field: str, path: Path, title: str) -> None:
    """Accuracy against a numeric config field (batch size, number of domains), one line per
    method and one panel per combination of the other varying fields."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [f for f in varying_columns(records) if f != field]
    panels = sorted({tuple(column_value(r["config"], f) for f in others) for r in records},
                    key=json.dumps)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        chosen = [r for r in records
                  if tuple(column_value(r["config"], f) for f in others) == panel]
        cells = aggregate(chosen, [field])
        for m in sorted({m for m, _ in cells}):
            xs = sorted(k[0] for mm, k in cells if mm == m)
            ys = [100 * mean_accuracy(cells[(m, (x,))]) for x in xs]
            ax.plot(xs, ys, marker="o", label=m)
        if field == "batch_size":
            ax.set_xscale("log", base=2)
        ax.set_xlabel(field.replace("_", " "))
        ax.set_ylabel("accuracy (%)")
        ax.set_title(" / ".join(str(v) for v in panel) or title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(title)
    save_figure(fig, path)


def plot_per_domain(records: list[dict[str, Any]], path: Path, title: str) -> None:
    """Accuracy per domain, one line per method (for the first stream configuration)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = records[0]["config"]
    same = [r for r in records
            if all(column_value(r["config"], f) == column_value(first, f) for f in COLUMN_KEYS)]
    fig, ax = plt.subplots(figsize=(10, 4))
    per_method: dict[str, list[dict]] = defaultdict(list)
    fields, short = row_fields(same, []), short_sources(same)
    for r in same:
        per_method[row_label(r["config"], fields, short)].append(r.get("per_domain", {}))
    domains = list(dict.fromkeys(d for r in same for d in r.get("per_domain", {})))
    for m, runs in sorted(per_method.items()):
        ax.plot(domains, [100 * np.mean([run[d] for run in runs if d in run] or [np.nan])
                          for d in domains], marker="o", label=m)
    ax.set_xlabel("domain (corruption)")
    ax.set_ylabel("accuracy (%)")
    stream = " / ".join(f"{f}={column_value(first, f)}" for f in COLUMN_KEYS)
    ax.set_title(f"{title}\n{stream}", fontsize=9)
    ax.tick_params(axis="x", rotation=60)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, path)


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    write_figure(fig, path, dpi=110)
    plt.close(fig)


def write_report(records: Iterable[dict[str, Any]], out_dir: str | os.PathLike,
                 title: str = "dyntta benchmark") -> list[Path]:
    """Write table.md, table.csv and the plots that the records support; return the paths."""
    records = list(records)
    check_records(records)
    out = Path(out_dir)
    markdown, csv_text = table(records)
    written = [out / "table.md", out / "table.csv"]
    write_atomic(written[0], f"# {title}\n\n{markdown}")
    write_atomic(written[1], csv_text)
    varying = varying_columns(records)
    for field, name in (("batch_size", "accuracy_vs_batch_size.png"),
                        ("n_domains", "accuracy_vs_n_domains.png")):
        if field in varying:
            plot_against(records, field, out / name, title)
            written.append(out / name)
    plot_per_domain(records, out / "accuracy_per_domain.png", title)
    written.append(out / "accuracy_per_domain.png")
    return written
