"""Tables and plots rendered from a results file alone.

The table follows the paper's Table 1: methods as rows, grouped into test-time fine-tuning
(methods that take a backward pass) and test-time normalisation; columns are the combinations of
the configuration fields that vary across the records (dataset x scenario for Table 1, batch
size, number of domains, delta, rounds ...); a last column averages them; the best mean of each
column is in bold. Accuracies are in %; with several seeds a cell reads ``mean ± std``.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from dyntta.atomic import write_atomic, write_figure
from dyntta.bench.config import COLUMN_KEYS
from dyntta.methods import method_class

GROUPS = ("Source", "Test-time fine-tuning", "Test-time normalisation")


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
    except ValueError:  # a method of another version of dyntta: keep it, ungrouped
        backward = False
    return GROUPS[1] if backward else GROUPS[2]


def aggregate(records: list[dict[str, Any]], columns: list[str]) -> dict:
    """``{(method_label, column_tuple): [accuracy per seed]}``."""
    cells: dict[tuple, list[float]] = defaultdict(list)
    for r in records:
        c = r["config"]
        cells[(method_label(c), tuple(column_value(c, f) for f in columns))].append(r["accuracy"])
    return cells


def table(records: list[dict[str, Any]], columns: list[str] | None = None) -> tuple[str, str]:
    """The Markdown table and the CSV (long format) of ``records``."""
    if not records:
        raise ValueError("no records to report")
    columns = columns or varying_columns(records)
    cells = aggregate(records, columns)
    methods = sorted({m for m, _ in cells}, key=lambda m: (GROUPS.index(group_of(m.split("(")[0])),
                                                          m))
    keys = sorted({k for _, k in cells}, key=lambda k: json.dumps(k))
    means = {mk: 100 * float(np.mean(v)) for mk, v in cells.items()}
    best = {k: max(means[(m, k)] for m in methods if (m, k) in means) for k in keys}
    averages = {m: float(np.mean([means[(m, k)] for k in keys])) for m in methods
                if all((m, k) in means for k in keys)}  # only methods with every column
    header = ["method", *[" / ".join(str(v) for v in k) for k in keys], "avg"]
    lines = [f"columns: {' / '.join(columns)}; accuracy (%)", "",
             "| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    group = None
    for m in methods:
        g = group_of(m.split("(")[0])
        if g != group:
            group = g
            lines.append(f"| *{g}* |" + " |" * (len(header) - 1))
        row = [m]
        for k in keys:
            if (m, k) not in cells:
                row.append("–")
                continue
            acc = 100 * np.asarray(cells[(m, k)])
            text = f"{acc.mean():.1f}" + (f" ± {acc.std(ddof=1):.1f}" if len(acc) > 1 else "")
            row.append(f"**{text}**" if np.isclose(acc.mean(), best[k]) else text)
        if m not in averages:
            row.append("–")
        else:
            text = f"{averages[m]:.1f}"
            row.append(f"**{text}**" if np.isclose(averages[m], max(averages.values())) else text)
        lines.append("| " + " | ".join(row) + " |")
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["method", "group", *columns, "accuracy_mean", "accuracy_std", "n_seeds"])
    for (m, k), v in sorted(cells.items(), key=lambda item: json.dumps(item[0])):
        std = float(np.std(v, ddof=1)) if len(v) > 1 else 0.0
        writer.writerow([m, group_of(m.split("(")[0]), *k, float(np.mean(v)), std, len(v)])
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
            ys = [100 * np.mean(cells[(m, (x,))]) for x in xs]
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
    for r in same:
        per_method[method_label(r["config"])].append(r["per_domain"])
    domains = list(same[0]["per_domain"])
    for m, runs in sorted(per_method.items()):
        ax.plot(domains, [100 * np.mean([run[d] for run in runs]) for d in domains],
                marker="o", label=m)
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
