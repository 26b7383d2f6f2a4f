"""The DYN paper's published numbers beside ours.

A published-numbers file is a CSV (``#`` lines are comments) with one row per printed cell:
``table, model, family, scenario, batch_size, n_domains, delta, rounds, method, accuracy, source``
(accuracy in %). ``published/dyn_paper.csv`` is the one for Jiang et al., "Discover Your
Neighbours: Advanced Stable Test-Time Adaptation in Dynamic World" (arXiv:2406.05413); it holds
only its header until its tables are transcribed (see the file). A measured cell matches a
published one when the dataset family (``cifar10`` / ``cifar100`` / ``imagenet``), scenario,
batch size, number of domains, delta, rounds and method agree, and the method ran with its
protocol's options; the model may differ (it is named in the output).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from dyntta.bench.protocols import DATASET_FAMILIES, protocol_options

PUBLISHED = Path(__file__).parent / "published" / "dyn_paper.csv"
MATCH = ("family", "scenario", "batch_size", "n_domains", "delta", "rounds", "method")


COLUMNS = ("table", "model", "family", "scenario", "batch_size", "n_domains", "delta", "rounds",
           "method", "accuracy", "source")


def published_rows(path: str | Path = PUBLISHED) -> list[dict[str, Any]]:
    """The published cells of ``path``, typed: ints for batch size, domains and rounds, floats
    (or None) for delta and accuracy. A malformed file is a ``ValueError`` naming the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"published-numbers file not found: {path}")
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if not line.startswith("#")]
    reader = csv.DictReader(line for _, line in lines)
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ValueError(f"{path}: the columns must be {', '.join(COLUMNS)}")
    for (number, _), row in zip(lines[1:], reader):
        try:
            rows.append({**row, "batch_size": int(row["batch_size"]),
                         "n_domains": int(row["n_domains"]), "rounds": int(row["rounds"]),
                         "delta": float(row["delta"]) if row["delta"] else None,
                         "accuracy": float(row["accuracy"])})
        except (TypeError, ValueError):
            raise ValueError(f"{path}: line {number} is not a published cell: {row}") from None
    return rows


def record_match_key(record: dict[str, Any]) -> tuple | None:
    """The published cell a record would match, or None when its dataset has no family or the
    method ran with options beyond its protocol's."""
    c = record["config"]
    family = c["dataset"].get("family") or DATASET_FAMILIES.get(c["dataset"]["name"])
    try:
        expected = protocol_options(c["method"], c.get("protocol", "dyn-paper"), family)
    except ValueError:  # no family, or a method this version does not know
        return None
    if (c.get("options") or {}) != expected:
        return None
    fields = {**c, "family": family}
    return tuple(fields[k] for k in MATCH)


def published_for(records: list[dict[str, Any]], rows: list[dict[str, Any]] | None = None
                  ) -> dict[tuple, dict[str, Any]]:
    """``{match key: published row}`` for the keys of ``records``; where several tables print
    the same cell, the first in the file (Table 1 before the later ones)."""
    rows = published_rows() if rows is None else rows
    wanted = {record_match_key(r) for r in records} - {None}
    found: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        key = tuple(row[k] for k in MATCH)
        if key in wanted and key not in found:
            found[key] = row
    return found


def comparison(records: list[dict[str, Any]], rows: list[dict[str, Any]] | None = None) -> str:
    """A Markdown table: per method and stream, our accuracy (mean over seeds), the published
    one and the difference (ours - published), in points; then the tables and models read."""
    rows = published_rows() if rows is None else rows
    found = published_for(records, rows)
    ours: dict[tuple, list[float]] = {}
    for r in records:
        key = record_match_key(r)
        if key in found:
            ours.setdefault(key, []).append(100 * r["accuracy"])
    if not rows:
        return "the published-numbers file holds no rows yet (see its header)\n"
    if not ours:
        return "no measured cell matches a published one (dataset family, scenario, batch " \
               "size, domains, delta, rounds and method must agree)\n"
    streams = sorted({k[:-1] for k in ours}, key=json.dumps)
    methods = sorted({k[-1] for k in ours})
    header = ["method", *["/".join(str(v) for v in s if v is not None) for s in streams]]
    lines = ["ours / published (difference), accuracy (%)", "",
             "| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for m in methods:
        row = [m]
        for s in streams:
            key = (*s, m)
            if key not in ours:
                row.append("–")
                continue
            mine = sum(ours[key]) / len(ours[key])
            theirs = found[key]["accuracy"]
            row.append(f"{mine:.1f} / {theirs:.1f} ({mine - theirs:+.1f})")
        lines.append("| " + " | ".join(row) + " |")
    sources = sorted({(found[k]["table"], found[k]["model"], found[k]["source"]) for k in ours})
    lines += [""] + [f"published: {t}, {model} ({src})" for t, model, src in sources]
    return "\n".join(lines) + "\n"
