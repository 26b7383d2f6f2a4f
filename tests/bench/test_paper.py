"""The DYN paper's published numbers: the shipped cells, what may match them, the comparison."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from scipy import stats as scipy_stats

from dyntta.bench.agreement import kendall_tau
from dyntta.bench.config import load_grid
from dyntta.bench.paper import (
    COLUMNS,
    comparison,
    our_runs,
    published_rows,
    rank_agreement,
    record_match_key,
)
from dyntta.cli import main
from dyntta.methods import method_class

CIFAR10_C = {"name": "cifar10-c", "path": "CIFAR-10-C", "checkpoint": "r50.pt", "family": "cifar10"}
REAL_NPZ = {"name": "npz", "path": "cifar10.npz", "checkpoint": "r20.th", "family": "cifar10"}
DIGITS = {"name": "digits", "path": None, "checkpoint": None, "family": "cifar10"}  # older runs


def measured(method, hits, seed=0, dataset=REAL_NPZ, size=64, **fields):
    """A record of ``method`` with these per-batch hits (batches of ``size``)."""
    config = {"dataset": dataset, "scenario": "crossmix", "batch_size": 64, "n_domains": 15,
              "rounds": 1, "delta": None, "severity": 5, "n_samples": 300, "method": method,
              "options": {}, "seed": seed, "protocol": "dyn-paper", **fields}
    n = [size] * len(hits)
    return {"key": json.dumps([method, seed, dataset, sorted(fields.items())]),
            "accuracy": sum(hits) / sum(n), "per_domain": {"fog": sum(hits) / sum(n)},
            "batch_correct": list(hits), "batch_n": n,
            "n_samples": sum(n), "model": "resnet20", "checkpoint_sha256": dataset["name"],
            "rows_fingerprint": json.dumps([seed, dataset, config["scenario"]]), "config": config}


def flat(method, accuracy, batches=40, **kw):
    """Every batch of 64 with the same number of hits (``accuracy`` rounded to 1/64)."""
    return measured(method, [round(64 * accuracy)] * batches, **kw)


def noisy(method, accuracy, seed=0, batches=60, **kw):
    """Hits drawn per batch around ``accuracy`` (the draw depends on the method and seed)."""
    rng = np.random.default_rng([seed, sum(map(ord, method))])
    return measured(method, rng.binomial(64, accuracy, size=batches).tolist(), seed=seed, **kw)


def cell(method, accuracy, table="Table 1", family="cifar10", scenario="crossmix", **kw):
    fields = {"batch_size": 64, "n_domains": 15, "delta": None, "rounds": 1, **kw}
    return {"table": table, "model": "ResNet-50", "family": family, "scenario": scenario,
            **fields, "method": method, "accuracy": accuracy, "source": "arXiv:2406.05413"}


# --- the shipped cells -----------------------------------------------------------------------

def test_the_shipped_file_holds_all_360_cells_of_the_paper():
    rows = published_rows()
    assert len(rows) == 360
    assert Counter(r["table"] for r in rows) == {
        "Table 1": 108, "Table 2 (ResNet-26)": 24, "Table 3 (domains)": 108,
        "Supp. Wild delta=0.1": 24, "Supp. Wild delta=0.01": 24, "Supp. Wild delta=0.005": 24,
        "Supp. Rounds=2": 24, "Supp. Rounds=3": 24}
    value = {(r["table"], r["family"], r["scenario"], r["delta"], r["method"]): r["accuracy"]
             for r in rows}
    t1 = {m: value[("Table 1", "cifar10", "crossmix", None, m)]
          for m in ("dyn", "note", "tbn", "source")}
    assert t1 == {"dyn": 71.54, "note": 63.03, "tbn": 61.96, "source": 57.39}
    assert value[("Table 1", "cifar10", "random", None, "deyo")] == 75.63
    assert value[("Table 1", "cifar10", "random", None, "dyn")] == 73.09
    assert value[("Supp. Wild delta=0.005", "cifar10", "wild", 0.005, "dyn")] == 69.38


# --- reading a published-numbers file --------------------------------------------------------

GOOD = "Table 1,ResNet-50,cifar10,crossmix,64,15,,1,dyn,71.54,arXiv:2406.05413"


def write_csv(tmp_path, *lines, encoding="utf-8", prefix=b""):
    path = tmp_path / "paper.csv"
    path.write_bytes(prefix + "\n".join(["# a comment", ",".join(COLUMNS), *lines]).encode(
        encoding) + b"\n")
    return path


@pytest.mark.parametrize("line, message", [
    (GOOD.replace("71.54", "0.7154"), "line 3, column accuracy: '0.7154' is below 1, so it "
                                      "reads as a fraction"),
    (GOOD.replace("71.54", "nan"), "line 3, column accuracy: 'nan' must be a finite number"),
    (GOOD.replace("71.54", "171"), "line 3, column accuracy: '171' must be a percentage"),
    (GOOD.replace("71.54", ""), "line 3, column accuracy: '' is not a number"),
    (GOOD + ",extra", "line 3: 12 fields, expected 11"),
    (GOOD.rsplit(",", 1)[0], "line 3: 10 fields, expected 11"),
    (GOOD.replace(",64,", ",big,"), "line 3, column batch_size: 'big' is not a whole number"),
    (GOOD.replace("cifar10", "svhn"), "line 3, column family: 'svhn' must be one of cifar10"),
    (GOOD.replace(",dyn,", ",dinn,"), "line 3, column method: 'dinn' must be one of"),
    (GOOD.replace("crossmix", "wild"), "line 3, column delta: a wild cell needs a delta"),
    (f"{GOOD}\n{GOOD}", "line 4: the same cell as line 3"),
])
def test_a_bad_published_file_is_refused_naming_file_line_and_column(tmp_path, line, message):
    path = write_csv(tmp_path, line)
    with pytest.raises(ValueError) as info:
        published_rows(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_a_byte_order_mark_is_accepted_and_other_encodings_are_named(tmp_path):
    assert published_rows(write_csv(tmp_path, GOOD, prefix=b"\xef\xbb\xbf"))[0]["accuracy"] == \
        71.54
    path = write_csv(tmp_path, GOOD.replace("ResNet-50", "ResNet-50 é"), encoding="latin-1")
    with pytest.raises(ValueError, match=r"paper.csv: not UTF-8 text \(byte 0xe9 at offset \d+"):
        published_rows(path)
    (tmp_path / "cols.csv").write_text("table,model\n")
    with pytest.raises(ValueError, match="line 1: the columns must be table, model, family"):
        published_rows(tmp_path / "cols.csv")


def test_report_paper_names_a_bad_file_in_one_line_through_the_real_cli(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(flat("dyn", 0.6)) + "\n")
    path = write_csv(tmp_path, GOOD.replace("71.54", "0.7154"))
    proc = subprocess.run([sys.executable, "-m", "dyntta.cli", "report", str(results),
                           "--paper", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "line 3, column accuracy" in proc.stderr


# --- what may match ---------------------------------------------------------------------------

def test_digits_never_matches_even_where_an_older_record_says_cifar10():
    assert record_match_key(flat("dyn", 0.6, dataset=DIGITS)) is None
    text = comparison([flat("dyn", 0.6, dataset=DIGITS), flat("tbn", 0.5, dataset=DIGITS)],
                      [cell("dyn", 71.54), cell("tbn", 61.96)])
    assert text.startswith("no measured run compares with a published cell")


def test_digits_cannot_take_a_family_nor_the_published_protocol(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('methods = ["tent"]\n[[datasets]]\nname = "digits"\n')
    with pytest.raises(ValueError, match=r"datasets\[0\]: digits has no family"):
        load_grid(grid, ['datasets=[{name = "digits", family = "cifar10"}]'])
    with pytest.raises(ValueError, match="digits has none, so run it with --protocol dyn-paper"):
        load_grid(grid, ['protocol="published"']).cells()


def test_other_severities_and_npz_without_family_never_match():
    assert record_match_key(flat("dyn", 0.6, severity=3)) is None
    assert record_match_key(flat("dyn", 0.6, dataset={**REAL_NPZ, "family": None})) is None
    assert record_match_key(flat("dyn", 0.6))[0] == "cifar10"
    text = comparison([flat("dyn", 0.6, severity=3)], [cell("dyn", 71.54)])
    assert text.startswith("no measured run compares")


def test_runs_of_two_datasets_are_never_averaged_together():
    records = [flat("dyn", 0.5), flat("tbn", 0.25), flat("source", 0.125),
               flat("dyn", 0.75, dataset=CIFAR10_C), flat("tbn", 0.625, dataset=CIFAR10_C)]
    groups = our_runs(records)
    assert len(groups) == 2
    text = comparison(records, [cell("dyn", 71.54), cell("tbn", 61.96), cell("source", 57.39)])
    blocks = [b for b in text.split("### ") if b.startswith("Table 1")]
    assert len(blocks) == 2
    by_data = {("CIFAR-10-C" in b): b for b in blocks}
    assert "| dyn | 75.0 ± 0.0 | 71.54 | – | +14.2 | +12.5 | +9.6 |" in by_data[True]
    assert "| dyn | 50.0 ± 0.0 | 71.54 | +37.5 | +14.2 | +25.0 | +9.6 |" in by_data[False]
    assert "62.5" not in by_data[False]  # the average of the two datasets appears nowhere
    for block in blocks:
        assert "model resnet20" in block and "the paper's: ResNet-50" in block


def test_seeds_are_averaged_and_options_beyond_the_protocol_never_match():
    records = [flat("dyn", 0.5), flat("dyn", 0.625, seed=1),
               flat("dyn", 0.9, seed=2, options={"alpha": 0.5})]
    assert record_match_key(records[2]) is None
    text = comparison(records, [cell("dyn", 71.54)])
    assert "| dyn | 56.2 ± " in text and "seeds 0 1," in text
    # a method that ran seed 0 only: every method is compared on seed 0
    text = comparison(records[:2] + [flat("tbn", 0.25)], [cell("dyn", 71.54), cell("tbn", 62)])
    assert "seeds 0 (1 runs of seeds not every method has left out)" in text
    assert "| dyn | 50.0 ± 0.0 | 71.54 | – | – | +25.0 | +9.5 |" in text


def test_protocols_are_compared_separately_and_share_the_backward_free_runs():
    published = method_class("tent").Config.PUBLISHED["cifar10"]
    records = [flat("tent", 0.5), flat("tbn", 0.25),
               flat("tent", 0.75, protocol="published", options=published)]
    groups = {g.protocol: g for g in our_runs(records)}
    assert set(groups) == {"dyn-paper", "published"}
    for protocol, tent in (("dyn-paper", 0.5), ("published", 0.75)):
        runs = groups[protocol].methods(("crossmix", 64, 15, None, 1))
        assert {m: [r["accuracy"] for r in v] for m, v in runs.items()} == \
            {"tbn": [0.25], "tent": [tent]}
    assert [g.protocol for g in our_runs(records[:2])] == ["dyn-paper"]


def test_a_shared_run_joins_a_protocol_only_on_streams_run_under_it():
    """A protocol-free method (tbn) on two streams; TENT under "published" on one of them: the
    "published" group holds that stream only, never a copy of the other without any of its own."""
    published = method_class("tent").Config.PUBLISHED["cifar10"]
    records = [flat("tbn", 0.25), flat("tbn", 0.5, scenario="random"), flat("tent", 0.5),
               flat("tent", 0.75, scenario="random", protocol="published", options=published)]
    groups = {g.protocol: g for g in our_runs(records)}
    assert sorted(k[:-1] for k in groups["dyn-paper"].runs) == [
        ("crossmix", 64, 15, None, 1), ("crossmix", 64, 15, None, 1), ("random", 64, 15, None, 1)]
    assert sorted(groups["published"].runs) == [("random", 64, 15, None, 1, "tbn"),
                                                ("random", 64, 15, None, 1, "tent")]


def test_a_run_is_shown_beside_every_table_that_prints_its_stream():
    text = comparison([flat("dyn", 0.5)], [cell("dyn", 71.54), cell("dyn", 60.0, table="T2")])
    assert "### Table 1: cifar10, crossmix" in text and "### T2: cifar10, crossmix" in text
    assert comparison([flat("dyn", 0.5, rounds=2)], [cell("dyn", 71.54)]).startswith("no measured")


# --- rank agreement ---------------------------------------------------------------------------

@pytest.mark.parametrize("x, y", [
    ([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]),
    ([3.1, 1.0, 2.2, 4.8, 0.5, 2.2], [2.0, 1.0, 2.0, 5.0, 0.1, 3.0]),  # ties on both sides
    ([0.6, 0.2, 0.9, 0.4], [71.5, 63.0, 61.9, 57.4]),
])
def test_kendall_tau_equals_scipy(x, y):
    assert kendall_tau(x, y) == pytest.approx(scipy_stats.kendalltau(x, y).statistic, abs=1e-12)
    rows = np.array([x, y[::-1], x])
    assert kendall_tau(rows, y) == pytest.approx(
        [scipy_stats.kendalltau(r, y).statistic for r in rows], abs=1e-12)


def test_rank_agreement_is_scipys_tau_of_the_seed_means_with_a_paired_interval():
    paper = {"dyn": 71.54, "note": 63.03, "tbn": 61.96, "source": 57.39, "deyo": 68.85}
    ours = {"dyn": 0.55, "note": 0.5, "tbn": 0.505, "source": 0.3, "deyo": 0.51}
    runs = {m: [noisy(m, a, seed=s) for s in (0, 1)] for m, a in ours.items()}
    tau, low, high, seeds = rank_agreement(runs, paper, resamples=500)
    means = [np.mean([r["accuracy"] for r in runs[m]]) for m in sorted(paper)]
    assert tau == pytest.approx(scipy_stats.kendalltau(means, [paper[m] for m in sorted(paper)])
                                .statistic)
    assert seeds == 2 and -1 <= low <= tau <= high <= 1 and low < high
    # a method that only ran seed 0 restricts everything to seed 0
    runs["dyn"] = runs["dyn"][:1]
    assert rank_agreement(runs, paper, resamples=100)[3] == 1
    assert rank_agreement({m: runs[m] for m in ("dyn", "tbn")}, paper) is None


def test_the_comparison_prints_gains_and_rank_agreement():
    records = [flat("dyn", 0.75), flat("tbn", 0.5), flat("source", 0.25), flat("note", 0.625)]
    rows = [cell("dyn", 71.54), cell("tbn", 61.96), cell("source", 57.39), cell("note", 63.03)]
    text = comparison(records, rows)
    assert "| note | 62.5 ± 0.0 | 63.03 | +37.5 | +5.6 | +12.5 | +1.1 |" in text
    assert "rank agreement of the 4 methods both have (Kendall's tau-b; common seeds: 1): " \
           "+1.00, 95% interval [+1.00, +1.00]" in text


def test_report_paper_writes_the_comparison(tmp_path, capsys):
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in [flat("dyn", 0.75),
                                                               flat("tbn", 0.5)]))
    assert main(["report", str(results), "--paper", str(write_csv(tmp_path, GOOD))]) == 0
    out = capsys.readouterr().out
    assert "| dyn | 75.0 ± 0.0 | 71.54 |" in out and "## The paper's claims" in out
    assert "71.54" in (tmp_path / "paper.md").read_text()
