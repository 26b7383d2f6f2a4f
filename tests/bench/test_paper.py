"""The DYN paper's published numbers: the shipped data and the side-by-side comparison."""

from __future__ import annotations

import json
from collections import defaultdict

from dyntta.bench.paper import COLUMNS, MATCH, comparison, published_for, published_rows
from dyntta.cli import main
from dyntta.bench.protocols import FAMILIES
from dyntta.data import SCENARIOS
from dyntta.methods import available_methods, method_class


def measured(method, acc, seed=0, scenario="crossmix", name="npz", family="cifar10",
             options=None, protocol="dyn-paper"):
    return {"accuracy": acc, "per_domain": {"fog": acc}, "config": {
        "dataset": {"name": name, "path": "x.npz", "checkpoint": "m.pt", "family": family},
        "scenario": scenario, "batch_size": 64, "n_domains": 15, "rounds": 1, "delta": None,
        "severity": 5, "n_samples": 2000, "method": method, "options": options or {},
        "seed": seed, "protocol": protocol}}


def row(method, acc, table="Table 1", scenario="crossmix", family="cifar10"):
    return {"table": table, "model": "ResNet-50", "family": family, "scenario": scenario,
            "batch_size": 64, "n_domains": 15, "delta": None, "rounds": 1, "method": method,
            "accuracy": acc, "source": "arXiv:2406.05413"}


def test_shipped_numbers_are_well_formed():
    """Whatever rows the shipped file holds (none until the paper is transcribed) are valid."""
    rows = published_rows()
    for r in rows:
        assert r["family"] in FAMILIES and r["scenario"] in SCENARIOS, r
        assert r["method"] in available_methods(), r
        assert 0 <= r["accuracy"] <= 100 and r["table"] and r["model"] and r["source"], r
    keys = defaultdict(list)
    for r in rows:
        keys[(r["table"], *(r[k] for k in MATCH))].append(r)
    assert all(len(v) == 1 for v in keys.values()), "a table prints each cell once"
    assert comparison([measured("dyn", 0.6)], []).startswith("the published-numbers file holds")


def test_report_paper_reads_a_published_file_and_names_a_bad_one(tmp_path, capsys):
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps({"key": str(i), **r}) + "\n" for i, r in enumerate(
        [measured("dyn", 0.60), measured("tbn", 0.50)])))
    published = tmp_path / "paper.csv"
    published.write_text("# transcribed by hand\n" + ",".join(COLUMNS) + "\n"
                         "Table 1,ResNet-50,cifar10,crossmix,64,15,,1,dyn,65.5,arXiv:2406.05413\n")
    assert main(["report", str(results), "--paper", str(published)]) == 0
    assert "| dyn | 60.0 / 65.5 (-5.5) |" in capsys.readouterr().out
    assert "65.5" in (tmp_path / "paper.md").read_text()
    published.write_text(",".join(COLUMNS) + "\nTable 1,R,cifar10,crossmix,big,15,,1,dyn,1,x\n")
    assert main(["report", str(results), "--paper", str(published)]) == 2
    assert "line 2 is not a published cell" in capsys.readouterr().err


def test_comparison_matches_family_stream_and_method_and_averages_seeds():
    records = [measured("dyn", 0.60), measured("dyn", 0.62, seed=1), measured("tbn", 0.50),
               measured("tbn", 0.55, scenario="random"),
               measured("dyn", 0.9, options={"alpha": 0.5}),  # beyond its protocol: unmatched
               measured("dyn", 0.9, name="digits", family=None)]  # digits is cifar10 too
    rows = [row("dyn", 65.5), row("tbn", 48.0), row("dyn", 70.0, table="Table 2"),
            row("dyn", 30.0, family="cifar100")]
    found = published_for(records, rows)
    assert {k[-1]: v["accuracy"] for k, v in found.items()} == {"dyn": 65.5, "tbn": 48.0}
    text = comparison(records, rows)
    dyn_line = next(line for line in text.splitlines() if line.startswith("| dyn |"))
    assert "70.7 / 65.5 (+5.2)" in dyn_line  # mean of 60, 62 and the digits run's 90
    assert "| tbn | 50.0 / 48.0 (+2.0) |" in text
    assert "published: Table 1, ResNet-50 (arXiv:2406.05413)" in text
    assert "Table 2" not in text


def test_no_match_says_what_must_agree():
    text = comparison([measured("dyn", 0.6, scenario="wild")], [row("dyn", 65.5)])
    assert text.startswith("no measured cell matches")


def test_published_protocol_matches_only_with_its_own_options():
    published = method_class("tent").Config.PUBLISHED["cifar10"]
    records = [measured("tent", 0.5, protocol="published", options=published),
               measured("tent", 0.4, protocol="published")]  # options not the protocol's
    text = comparison(records, [row("tent", 52.0)])
    assert "| tent | 50.0 / 52.0 (-2.0) |" in text
