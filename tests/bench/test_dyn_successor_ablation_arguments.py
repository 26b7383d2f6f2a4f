"""``benchmarks/dyn_successor_ablation.py``: every ``--set`` given counts, repeated or listed."""

from benchmarks.dyn_successor_ablation import parse_arguments


def test_repeated_sets_all_apply():
    args = parse_arguments(["--grid", "g.toml", "--out", "o.jsonl", "--set", "seeds=[0]",
                            "--set", "stream.batch_sizes=[64]", "a=1"])
    assert args.overrides == ["seeds=[0]", "stream.batch_sizes=[64]", "a=1"]
    assert parse_arguments(["--grid", "g.toml", "--out", "o.jsonl"]).overrides == []
