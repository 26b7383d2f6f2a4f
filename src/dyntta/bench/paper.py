"""The DYN paper's published numbers beside ours: which cells compare, and how they compare.

A published-numbers file is a CSV (``#`` lines are comments; one line per row, UTF-8, a leading
byte-order mark is accepted) with one row per printed cell:
``table, model, family, scenario, batch_size, n_domains, delta, rounds, method, accuracy, source``.
Accuracies are percentages in [1, 100]: a value below 1 is read as a fraction (0.6 for 60%) and
refused, like a missing, extra or unparsable field. ``published/dyn_paper.csv`` holds the 360
cells of Jiang et al., "Discover Your Neighbours: Advanced Stable Test-Time Adaptation in Dynamic
World" (arXiv:2406.05413).

A measured run compares with a published cell only when its data is one of the paper's datasets
(a ``cifar10-c`` / ``cifar100-c`` / ``imagenet-c`` folder, or an ``npz`` grid that declares its
``family``; never ``digits``) at the paper's severity, its stream (scenario, batch size, domains,
delta, rounds) is the cell's, and the method ran with its protocol's options. Runs are grouped by
dataset (kind, files, rows, model) and protocol, never averaged across two of them; the models
differ from the paper's, so what the comparison weighs is each method's gain over source and TBN
and the methods' ranking (Kendall's tau with a bootstrap interval over test batches).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from dyntta.bench.agreement import kendall_tau
from dyntta.bench.protocols import (
    DATASET_FAMILIES,
    FAMILIES,
    NO_FAMILY,
    PROTOCOLS,
    protocol_options,
)
from dyntta.bench.report import batches, has_batches, percent, same_streams
from dyntta.bench.stats import RESAMPLES, percentile_interval, resampled_means
from dyntta.data import SCENARIOS
from dyntta.methods import available_methods

PUBLISHED = Path(__file__).parent / "published" / "dyn_paper.csv"
PAPER_SEVERITY = 5
STREAM = ("scenario", "batch_size", "n_domains", "delta", "rounds")
MATCH = ("family", *STREAM, "method")
COLUMNS = ("table", "model", "family", "scenario", "batch_size", "n_domains", "delta", "rounds",
           "method", "accuracy", "source")
BOM = "\ufeff"


def _number(text: str, kind=float):
    try:
        return kind(text)
    except ValueError:
        raise ValueError("is not a whole number" if kind is int else "is not a number") from None


def _positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def _percentage(text: str) -> float:
    value = _number(text)
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    if 0 <= value < 1:
        raise ValueError("is below 1, so it reads as a fraction: give percentages (60 for 60%)")
    if not 1 <= value <= 100:
        raise ValueError("must be a percentage in [1, 100]")
    return value


def _one_of(valid):
    def check(text: str) -> str:
        if text not in valid:
            raise ValueError(f"must be one of {', '.join(valid)}")
        return text
    return check


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError("is empty")
    return text


def _delta(text: str) -> float | None:
    if not text:
        return None
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError("must be a positive number, or empty outside the wild scenario")
    return value


FIELDS = {"table": _text, "model": _text, "family": _one_of(FAMILIES),
          "scenario": _one_of(SCENARIOS), "batch_size": _positive_int,
          "n_domains": _positive_int, "delta": _delta, "rounds": _positive_int,
          "method": _one_of(available_methods()), "accuracy": _percentage, "source": _text}


def _decoded(path: Path) -> str:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}); save it as UTF-8") from None
    return text[1:] if text.startswith(BOM) else text


def published_rows(path: str | Path = PUBLISHED) -> list[dict[str, Any]]:
    """The published cells of ``path``, typed (ints for batch size, domains and rounds, floats
    for accuracy and delta, None for an empty delta). Anything malformed is a ``ValueError`` of
    one line naming the file, the line and the column."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"published-numbers file not found: {path}")
    lines = [(n, line) for n, line in enumerate(_decoded(path).splitlines(), 1)
             if line.strip() and not line.startswith("#")]
    if not lines or tuple(next(csv.reader([lines[0][1]]))) != COLUMNS:
        where = f"line {lines[0][0]}" if lines else "no header"
        raise ValueError(f"{path}: {where}: the columns must be {', '.join(COLUMNS)}")
    rows, seen = [], {}
    for number, line in lines[1:]:
        fields = next(csv.reader([line]))
        if len(fields) != len(COLUMNS):
            raise ValueError(f"{path}: line {number}: {len(fields)} fields, expected "
                             f"{len(COLUMNS)} ({', '.join(COLUMNS)})")
        row = {}
        for column, text in zip(COLUMNS, fields):
            try:
                row[column] = FIELDS[column](text.strip())
            except ValueError as exc:
                raise ValueError(f"{path}: line {number}, column {column}: {text!r} "
                                 f"{exc}") from None
        if (row["scenario"] == "wild") != (row["delta"] is not None):
            raise ValueError(f"{path}: line {number}, column delta: a wild cell needs a delta, "
                             "other scenarios none")
        cell = (row["table"], *(row[k] for k in MATCH))
        if cell in seen:
            raise ValueError(f"{path}: line {number}: the same cell as line {seen[cell]}")
        seen[cell] = number
        rows.append(row)
    return rows


def paper_family(record: dict[str, Any]) -> str | None:
    """The family of a record's data when it is one of the paper's datasets at the paper's
    severity (``digits`` never is, nor an ``npz`` set that declares no family), else None."""
    c = record["config"]
    dataset = c["dataset"]
    if dataset["name"] in NO_FAMILY or c.get("severity") != PAPER_SEVERITY:
        return None
    return dataset.get("family") or DATASET_FAMILIES.get(dataset["name"])


def record_match_key(record: dict[str, Any]) -> tuple | None:
    """The published cell a record would match, or None when its data is not the paper's or the
    method ran with options beyond its protocol's."""
    c = record["config"]
    family = paper_family(record)
    if family is None:
        return None
    try:
        expected = protocol_options(c["method"], c.get("protocol", "dyn-paper"), family)
    except ValueError:  # a method this version does not know
        return None
    if (c.get("options") or {}) != expected:
        return None
    return tuple({**c, "family": family}[k] for k in MATCH)


def protocols_of(record: dict[str, Any], family: str) -> tuple[str, ...]:
    """The protocols a record stands for: its own, or every one where the method's options are
    the same under all (a backward-free method runs alike under both)."""
    method = record["config"]["method"]
    if all(protocol_options(method, p, family) == {} for p in PROTOCOLS):
        return PROTOCOLS
    return (record["config"].get("protocol", "dyn-paper"),)


@dataclasses.dataclass
class Ours:
    """Our runs of one dataset (kind, files, rows, model) under one protocol."""

    label: str
    family: str
    protocol: str
    runs: dict[tuple, dict[int, dict]]  # (stream..., method) -> {seed: record}

    def methods(self, stream: tuple) -> dict[str, list[dict]]:
        out = {k[-1]: [v[s] for s in sorted(v)] for k, v in self.runs.items() if k[:-1] == stream}
        return dict(sorted(out.items()))


def dataset_label(record: dict[str, Any]) -> str:
    c = record["config"]
    d = c["dataset"]
    files = ", ".join(f"{k} {d[k]}" for k in ("path", "checkpoint") if d.get(k))
    rows = c.get("n_samples") or "all"
    return (f"{d['name']} ({files}; family {paper_family(record)}; {rows} rows per domain; "
            f"model {record.get('model', '?')})")


def our_runs(records: list[dict[str, Any]]) -> list[Ours]:
    """The records that compare with the paper, grouped by dataset and protocol. A record of a
    method that runs alike under every protocol joins each protocol's group, but only for the
    streams where some record ran under that protocol itself."""
    matched = []
    for r in records:
        key = record_match_key(r)
        if key is not None:
            identity = json.dumps([r["config"]["dataset"], r["config"].get("n_samples"),
                                   r.get("model"), r.get("checkpoint_sha256")], sort_keys=True)
            matched.append((r, key, identity))
    own = {(identity, r["config"].get("protocol", "dyn-paper"), key[1:-1])
           for r, key, identity in matched}
    groups: dict[tuple, Ours] = {}
    for r, key, identity in matched:
        for protocol in protocols_of(r, key[0]):
            if (identity, protocol, key[1:-1]) in own:
                group = groups.setdefault((identity, protocol),
                                          Ours(dataset_label(r), key[0], protocol, {}))
                group.runs.setdefault(key[1:], {}).setdefault(r["config"]["seed"], r)
    return [g for _, g in sorted(groups.items())]


def published_blocks(rows: list[dict[str, Any]]) -> dict[tuple, dict[str, dict]]:
    """``{(table, family, stream...): {method: row}}``: one column of a published table each."""
    blocks: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for row in rows:
        blocks[(row["table"], row["family"], *(row[k] for k in STREAM))][row["method"]] = row
    return blocks


def common_seed_runs(runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Each method's runs restricted to the seeds every method has (sorted by seed)."""
    if not runs:
        return {}
    seeds = set.intersection(*({r["config"]["seed"] for r in v} for v in runs.values()))
    return {m: [r for r in v if r["config"]["seed"] in seeds] for m, v in runs.items()}


def rank_agreement(runs: dict[str, list[dict]], published: dict[str, float],
                   resamples: int = RESAMPLES) -> tuple[float, float, float, int] | None:
    """Kendall's tau-b between our methods' mean accuracies and the published ones, over the
    methods both have and the seeds all of them ran, with a 95% percentile bootstrap interval:
    test batches are resampled, the same draws for every method (they saw the same streams).
    Returns ``(tau, low, high, seeds)``, or None with fewer than 3 methods or no common seed."""
    methods = sorted(set(runs) & set(published))
    if len(methods) < 3:
        return None
    runs = common_seed_runs({m: runs[m] for m in methods})
    n_seeds = len(runs[methods[0]])
    if n_seeds == 0:
        return None
    paper = np.array([published[m] for m in methods])
    ours = np.array([np.mean([r["accuracy"] for r in runs[m]]) for m in methods])
    tau = float(kendall_tau(ours, paper))
    if not all(has_batches(runs[m]) for m in methods):
        return tau, math.nan, math.nan, n_seeds
    paired = all(same_streams(runs[methods[0]], runs[m]) for m in methods)
    draws = np.stack([resampled_means(*batches(runs[m]), seed=0 if paired else i,
                                      resamples=resamples) for i, m in enumerate(methods)], 1)
    low, high = percentile_interval(kendall_tau(draws, paper))
    return tau, low, high, n_seeds


def _gain(values: dict[str, float], method: str, base: str) -> str:
    if method not in values or base not in values:
        return "–"
    return f"{values[method] - values[base]:+.1f}"


def stream_label(family: str, stream: tuple) -> str:
    fields = dict(zip(STREAM, stream))
    text = f"{family}, {fields['scenario']}, B = {fields['batch_size']}, " \
           f"{fields['n_domains']} domains"
    if fields["delta"] is not None:
        text += f", delta {fields['delta']}"
    return text + (f", {fields['rounds']} rounds" if fields["rounds"] > 1 else "")


def block_comparison(block: tuple, published: dict[str, dict], ours: Ours) -> str:
    """One published table column beside our runs of the same stream: accuracies, gains over
    source and TBN in both, and the rank agreement."""
    table, family, *stream = block
    every = ours.methods(tuple(stream))
    runs = common_seed_runs(every)  # gains and ranks compare methods on the same seeds
    left_out = sum(len(v) for v in every.values()) - sum(len(v) for v in runs.values())
    runs = {m: v for m, v in runs.items() if v}
    paper = {m: row["accuracy"] for m, row in published.items()}
    mine = {m: 100 * float(np.mean([r["accuracy"] for r in v])) for m, v in runs.items()}
    seeds = sorted({r["config"]["seed"] for v in runs.values() for r in v})
    note = f" ({left_out} runs of seeds not every method has left out)" if left_out else ""
    images = sorted({r["n_samples"] for v in runs.values() for r in v if "n_samples" in r})
    models = sorted({row["model"] for row in published.values()})
    sources = sorted({row["source"] for row in published.values()})
    lines = [f"### {table}: {stream_label(family, tuple(stream))}", "",
             f"ours: {ours.label}, protocol {ours.protocol}, seeds "
             f"{' '.join(map(str, seeds)) or 'none in common'}{note}, "
             f"{'/'.join(map(str, images)) or '?'} test images per run; the paper's: "
             f"{', '.join(models)} ({'; '.join(sources)})", "",
             "| method | ours (%) | paper (%) | ours − source | paper − source | ours − TBN "
             "| paper − TBN |", "|---|---:|---:|---:|---:|---:|---:|"]
    order = sorted(set(paper) | set(mine), key=lambda m: (-paper.get(m, -1), m))
    for m in order:
        theirs = f"{paper[m]:.2f}" if m in paper else "–"
        own = percent(runs[m]) if m in mine else "–"
        lines.append(f"| {m} | {own} | {theirs} | {_gain(mine, m, 'source')} | "
                     f"{_gain(paper, m, 'source')} | {_gain(mine, m, 'tbn')} | "
                     f"{_gain(paper, m, 'tbn')} |")
    agreement = rank_agreement(runs, paper)
    lines.append("")
    if agreement is None:
        lines.append("rank agreement: needs 3 or more methods both have, run on common seeds")
    else:
        tau, low, high, n_seeds = agreement
        both = len(set(runs) & set(paper))
        bounds = "no interval (records without per-batch hits)" if math.isnan(low) else \
            f"95% interval [{low:+.2f}, {high:+.2f}] (bootstrap over test batches, paired " \
            "across methods)"
        lines.append(f"rank agreement of the {both} methods both have (Kendall's tau-b; "
                     f"common seeds: {n_seeds}): {tau:+.2f}, {bounds}")
    return "\n".join(lines) + "\n"


def comparison(records: list[dict[str, Any]], rows: list[dict[str, Any]] | None = None) -> str:
    """Markdown: every published table column that our runs cover, beside them (see
    :func:`block_comparison`), then the paper's claims with their verdicts."""
    from dyntta.bench.claims import claims_report

    rows = published_rows() if rows is None else rows
    if not rows:
        return "the published-numbers file holds no rows\n"
    groups = our_runs(records)
    parts = []
    for block, published in published_blocks(rows).items():
        for ours in groups:
            if ours.family == block[1] and ours.methods(tuple(block[2:])):
                parts.append(block_comparison(block, published, ours))
    if not parts:
        return ("no measured run compares with a published cell: the data must be one of the "
                "paper's datasets (cifar10-c / cifar100-c / imagenet-c, or npz with its family; "
                f"never digits) at severity {PAPER_SEVERITY}, and the scenario, batch size, "
                "domains, delta, rounds and method must agree\n")
    return "\n".join(parts) + "\n" + claims_report(groups, rows)
