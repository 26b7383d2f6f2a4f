"""``benchmarks/dyn_successor_ablation.py``: every ``--set`` given counts, repeated or listed;
every named variant is a valid ``dyn_adaptive`` configuration; its table bolds the best label
and those tied with it; its records carry what the bench's carry."""

import json

from benchmarks import dyn_successor_ablation
from benchmarks.dyn_successor_ablation import VARIANTS, compact, parse_arguments
from dyntta.bench.runner import git_revision, versions
from dyntta.methods.dyn_adaptive import DYNAdaptiveConfig
from tests.bench.helpers import GRID_TOML, tiny_source


def test_repeated_sets_all_apply():
    args = parse_arguments(["--grid", "g.toml", "--out", "o.jsonl", "--set", "seeds=[0]",
                            "--set", "stream.batch_sizes=[64]", "a=1"])
    assert args.overrides == ["seeds=[0]", "stream.batch_sizes=[64]", "a=1"]
    assert parse_arguments(["--grid", "g.toml", "--out", "o.jsonl"]).overrides == []


def test_every_variant_is_a_valid_dyn_adaptive_config():
    for options in VARIANTS.values():
        DYNAdaptiveConfig(**options)  # an unknown option or an invalid value raises


def record(label: str, correct: list[int]) -> dict:
    config = {"dataset": {"name": "digits"}, "batch_size": 8, "scenario": "crossmix",
              "delta": None}
    return {"variant": label, "seed": 0, "config": config, "batch_correct": correct,
            "batch_n": [8] * len(correct), "accuracy": sum(correct) / (8 * len(correct))}


def test_table_bolds_the_best_and_the_labels_tied_with_it():
    best = [7, 8, 6, 7, 8, 7, 6, 8] * 4
    near = [c + d for c, d in zip(best, [0, -1, 1, 0, -1, 0, 1, -1] + [0] * 24)]  # 1 fewer
    records = [record("dyn", best), record("tbn", near), record("iabn", [c - 4 for c in best]),
               record("mine", [c - 3 for c in best])]
    row = compact(records, ["dyn", "tbn", "iabn", "mine"], "mine").splitlines()[2]
    dyn, tbn, iabn, mine = row.split(" | ")[4:8]
    # dyn is best; tbn's difference to it holds 0 (a tie); iabn and mine lose every batch
    assert (dyn, tbn, iabn, mine) == ("**89.1**", "**88.7**", "39.1", "51.6")
    assert row.endswith("| -37.5 [-37.5, -37.5] - (dyn) |")


def test_its_records_carry_the_provenance_of_the_bench_records(tmp_path, monkeypatch):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID_TOML.replace("seeds = [0, 1]", "seeds = [0]").replace(
        '"crossmix", "continual"', '"crossmix"'))
    monkeypatch.setattr(dyn_successor_ablation, "resolve_source", tiny_source)
    out = tmp_path / "ablation.jsonl"
    dyn_successor_ablation.main(["--grid", str(grid), "--out", str(out), "--variants"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in records] == ["source", "tbn", "dyn"]
    for r in records:
        assert (r["versions"], r["git_revision"], r["grid"]) == \
            (versions(), git_revision(), "tiny grid")
