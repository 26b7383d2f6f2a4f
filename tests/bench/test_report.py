"""Tables and plots rendered from records alone."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from scipy import stats

from dyntta.bench.report import MIN_BATCHES, table, varying_columns, write_report
from dyntta.bench.stats import bootstrap_interval


def record(method, scenario, acc, seed=0, options=None, batch_size=64, hits=None):
    r = {
        "key": f"{method}-{scenario}-{seed}-{batch_size}-{options}",
        "accuracy": acc,
        "per_domain": {"gaussian_noise": acc, "fog": acc / 2} if acc is not None else {},
        "config": {
            "dataset": {"name": "digits", "path": None, "checkpoint": None},
            "scenario": scenario, "batch_size": batch_size, "n_domains": 2, "rounds": 1,
            "delta": None, "severity": 5, "n_samples": None, "method": method,
            "options": options or {}, "seed": seed,
        },
    }
    if hits is not None:  # per-batch hits on a stream of 10-sample batches
        r.update(batch_correct=list(hits), batch_n=[10] * len(hits),
                 rows_fingerprint=f"{scenario}-{seed}", n_samples=10 * len(hits),
                 accuracy=sum(hits) / (10 * len(hits)))
    return r


RECORDS = [
    record("source", "crossmix", 0.30), record("source", "random", 0.40),
    record("tent", "crossmix", 0.50), record("tent", "random", 0.20),
    record("dyn", "crossmix", 0.60), record("dyn", "random", 0.30),
    record("dyn", "crossmix", 0.70, seed=1), record("dyn", "random", 0.36, seed=1),
]


def rows(markdown):
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in markdown.splitlines() if line.startswith("| ") and "---" not in line}


def test_table_has_groups_means_seed_intervals_best_marks_and_averages():
    markdown, _ = table(RECORDS, ["dataset", "scenario"])
    r = rows(markdown)
    assert r["method"] == ["digits / crossmix", "digits / random", "avg"]
    assert r["source"] == ["30.0", "**40.0**", "35.0"]
    assert r["tent"] == ["50.0", "20.0", "35.0"]
    half = stats.t.ppf(0.975, 1) * np.std([60, 70], ddof=1) / np.sqrt(2)  # t over 2 seeds
    assert r["dyn"] == [f"**65.0 ± {half:.1f}**", f"33.0 ± {half * 0.6:.1f}", "**49.0**"]
    order = [line.split("|")[1].strip() for line in markdown.splitlines() if line.startswith("| ")]
    assert order.index("*Source*") < order.index("source") < order.index("*Test-time fine-tuning*")
    assert order.index("tent") < order.index("*Test-time normalisation*") < order.index("dyn")


def test_a_method_this_version_does_not_know_keeps_its_row_in_a_group_of_its_own():
    markdown, text = table(RECORDS + [record("newer_method", "crossmix", 0.9)])
    order = [line.split("|")[1].strip() for line in markdown.splitlines() if line.startswith("| ")]
    assert order.index("dyn") < order.index("*Not known to this version of dyntta*") < \
        order.index("newer_method")
    row = next(d for d in csv.DictReader(io.StringIO(text)) if d["method"] == "newer_method")
    assert row["group"] == "Not known to this version of dyntta"


def test_every_method_tied_with_the_best_is_bold():
    """Per-batch hits on one stream of 200 batches: dyn is best, tbn one sample ahead or behind
    at random in some batches (tied), source far behind (not tied)."""
    rng = np.random.default_rng(0)
    dyn = rng.binomial(10, 0.6, size=200)
    tbn = np.clip(dyn + rng.choice([-1, 0, 1], size=200), 0, 10)
    while tbn.sum() >= dyn.sum():  # make dyn the best by the smallest margin
        tbn[np.argmax(tbn)] -= 1
    source = rng.binomial(10, 0.3, size=200)
    records = [record("dyn", "crossmix", None, hits=dyn), record("tbn", "crossmix", None, hits=tbn),
               record("source", "crossmix", None, hits=source)]
    r = rows(table(records)[0])
    low, high = bootstrap_interval(dyn, [10] * 200)
    assert r["dyn"][0] == f"**{100 * dyn.mean() / 10:.1f} ± {50 * (high - low):.1f}**"
    assert r["tbn"][0].startswith("**") and not r["source"][0].startswith("**")
    # a consistent gap of one sample in every batch is not a tie, however close the means
    records[1] = record("tbn", "crossmix", None, hits=np.maximum(dyn - 1, 0))
    assert not rows(table(records)[0])["tbn"][0].startswith("**")


def test_csv_is_long_format_with_intervals():
    _, text = table(RECORDS)
    data = list(csv.DictReader(io.StringIO(text)))
    dyn = next(d for d in data if d["method"] == "dyn" and d["scenario"] == "crossmix")
    assert float(dyn["accuracy_mean"]) == pytest.approx(0.65)
    low, high = stats.t.interval(0.95, 1, loc=0.65, scale=stats.sem([0.6, 0.7]))
    assert (float(dyn["ci_low"]), float(dyn["ci_high"])) == pytest.approx((low, high))
    assert dyn["interval"] == "t over seeds" and dyn["tied_with_best"] == "True"
    assert dyn["n_seeds"] == "2" and dyn["group"] == "Test-time normalisation"


def test_a_record_without_config_is_named():
    with pytest.raises(ValueError, match="record 2: config must be a non-empty object"):
        table([RECORDS[0], {"key": "x", "accuracy": 0.5}])


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


def test_runs_that_differ_beyond_method_and_columns_are_separate_rows_never_seeds():
    """The same cell under two protocols (no options either way, as for the backward-free
    methods) or eager and compiled: separate rows, each of one seed, the differing field named."""
    def variant(acc, **config):
        r = record("tbn", "crossmix", acc)
        r["config"].update(config)
        r["key"] += json.dumps(config)
        return r

    records = [variant(0.5, protocol="dyn-paper"), variant(0.7, protocol="published"),
               record("dyn", "crossmix", 0.6)]
    markdown, text = table(records)
    r = rows(markdown)
    assert r['tbn [protocol="dyn-paper"]'] == ["50.0", "50.0"]
    assert r['tbn [protocol="published"]'] == ["**70.0**", "**70.0**"]
    assert r["dyn [protocol=null]"] == ["60.0", "60.0"]
    assert {d["n_seeds"] for d in csv.DictReader(io.StringIO(text))} == {"1"}
    compiled = [variant(0.5, compile=False), variant(0.5, compile=True)]
    assert set(rows(table(compiled)[0])) >= {"tbn [compile=false]", "tbn [compile=true]"}


def test_two_models_on_one_dataset_are_rows_named_by_their_models():
    """Sources told apart by their model names show those names; where two share a name (the
    same checkpoint name, other data), the whole source."""
    def on(model, acc, data="d1"):
        r = record("tbn", "crossmix", acc)
        r["config"]["source"] = {"model": model, "data_sha256": data}
        r["key"] += model + data
        return r

    assert set(rows(table([on("r20.th", 0.5), on("r8.pt", 0.6)])[0])) >= \
        {"tbn [source=r20.th]", "tbn [source=r8.pt]"}
    assert set(rows(table([on("r20.th", 0.5), on("r20.th", 0.6, "d2")])[0])) >= {
        'tbn [source={"data_sha256": "d1", "model": "r20.th"}]',
        'tbn [source={"data_sha256": "d2", "model": "r20.th"}]'}


def test_two_records_of_one_seed_that_nothing_tells_apart_are_an_error():
    twin = record("dyn", "crossmix", 0.2)
    twin["key"] = "another key"
    with pytest.raises(ValueError, match="dyn at digits / crossmix: several records of one seed"):
        table([record("dyn", "crossmix", 0.6), twin], ["dataset", "scenario"])


@pytest.mark.parametrize("n_batches", [1, 3, MIN_BATCHES - 1])
def test_below_the_minimum_of_batches_no_interval_and_no_best(n_batches):
    """A bootstrap over a few batches is no interval (one batch gives ± 0.0): the cell shows its
    mean and batch count, the CSV no bounds, and the column marks no best."""
    good, bad = record("dyn", "crossmix", None, hits=[9] * n_batches), \
        record("source", "crossmix", None, hits=[1] * n_batches)
    markdown, text = table([good, bad])
    r = rows(markdown)
    assert r["dyn"][0] == f"90.0 ({n_batches} batches)" and r["source"][0].startswith("10.0 (")
    assert not any(cell.startswith("**") for row in (r["dyn"], r["source"]) for cell in row)
    data = {d["method"]: d for d in csv.DictReader(io.StringIO(text))}
    assert data["dyn"]["ci_low"] == "" and data["dyn"]["tied_with_best"] == "False"
    assert data["dyn"]["interval"] == f"none (fewer than {MIN_BATCHES} batches)"


def test_from_the_minimum_of_batches_the_bootstrap_interval_and_the_best():
    hits = [9, 8] * (MIN_BATCHES // 2)
    good, bad = record("dyn", "crossmix", None, hits=hits), \
        record("source", "crossmix", None, hits=[1] * MIN_BATCHES)
    r = rows(table([good, bad])[0])
    low, high = bootstrap_interval(hits, [10] * MIN_BATCHES)
    assert r["dyn"][0] == f"**85.0 ± {50 * (high - low):.1f}**"


@pytest.mark.parametrize("change, words", [
    ({"accuracy": 4.0}, "accuracy must be a number in \\[0, 1\\]"),
    ({"accuracy": float("nan")}, "accuracy must be a number"),
    ({"per_domain": {"fog": 1.5}}, "per_domain must map domains to numbers in \\[0, 1\\]"),
    ({"batch_correct": [11, 1]}, "batch_correct must lie within 0..batch_n"),
    ({"accuracy": 0.7}, "accuracy 0.7 is not the batches' 10 / 20"),
])
def test_an_impossible_record_is_refused_naming_the_field(change, words):
    bad = {**record("dyn", "crossmix", None, hits=[5, 5]), **change}
    with pytest.raises(ValueError, match=f"record 1: {words}"):
        table([bad])
