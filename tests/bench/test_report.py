"""Tables and plots rendered from records alone."""

from __future__ import annotations

import csv
import io

import pytest

from dyntta.bench.report import table, varying_columns, write_report


def record(method, scenario, acc, seed=0, options=None, batch_size=64):
    return {
        "key": f"{method}-{scenario}-{seed}-{batch_size}",
        "accuracy": acc,
        "per_domain": {"gaussian_noise": acc, "fog": acc / 2},
        "config": {
            "dataset": {"name": "digits", "path": None, "checkpoint": None},
            "scenario": scenario, "batch_size": batch_size, "n_domains": 2, "rounds": 1,
            "delta": None, "severity": 5, "n_samples": None, "method": method,
            "options": options or {}, "seed": seed,
        },
    }


RECORDS = [
    record("source", "crossmix", 0.30), record("source", "random", 0.40),
    record("tent", "crossmix", 0.50), record("tent", "random", 0.20),
    record("dyn", "crossmix", 0.60), record("dyn", "random", 0.30),
    record("dyn", "crossmix", 0.70, seed=1), record("dyn", "random", 0.36, seed=1),
]


def rows(markdown):
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in markdown.splitlines() if line.startswith("| ") and "---" not in line}


def test_table_has_groups_means_stds_best_marks_and_averages():
    markdown, _ = table(RECORDS, ["dataset", "scenario"])
    r = rows(markdown)
    assert r["method"] == ["digits / crossmix", "digits / random", "avg"]
    assert r["source"] == ["30.0", "**40.0**", "35.0"]
    assert r["tent"] == ["50.0", "20.0", "35.0"]
    assert r["dyn"] == ["**65.0 ± 7.1**", "33.0 ± 4.2", "**49.0**"]  # best average too
    order = [line.split("|")[1].strip() for line in markdown.splitlines() if line.startswith("| ")]
    assert order.index("*Source*") < order.index("source") < order.index("*Test-time fine-tuning*")
    assert order.index("tent") < order.index("*Test-time normalisation*") < order.index("dyn")


def test_csv_is_long_format_with_seed_statistics():
    _, text = table(RECORDS)
    data = list(csv.DictReader(io.StringIO(text)))
    dyn = next(d for d in data if d["method"] == "dyn" and d["scenario"] == "crossmix")
    assert float(dyn["accuracy_mean"]) == pytest.approx(0.65)
    assert float(dyn["accuracy_std"]) == pytest.approx(0.0707107, rel=1e-5)
    assert dyn["n_seeds"] == "2" and dyn["group"] == "Test-time normalisation"


def test_options_make_separate_rows_and_missing_cells_show_a_dash():
    markdown, _ = table(RECORDS + [record("dyn", "crossmix", 0.1, options={"alpha": 0.5})])
    assert rows(markdown)["method"] == ["crossmix", "random", "avg"]
    assert rows(markdown)["dyn(alpha=0.5)"] == ["10.0", "–", "–"]


def test_varying_columns_and_plots(tmp_path):
    sizes = [record(m, "crossmix", a * b / 64, batch_size=b)
             for m, a in (("tbn", 0.5), ("dyn", 0.6)) for b in (1, 16, 64)]
    assert varying_columns(sizes) == ["batch_size"]
    written = write_report(sizes, tmp_path, "sizes")
    names = sorted(p.name for p in written)
    assert names == ["accuracy_per_domain.png", "accuracy_vs_batch_size.png", "table.csv",
                     "table.md"]
    for p in written:
        assert p.stat().st_size > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_no_records_is_an_error():
    with pytest.raises(ValueError, match="no records"):
        table([])
