"""``benchmarks/dyn_successor_ablation.py``: every ``--set`` given counts, repeated or listed;
every named variant is a valid ``dyn_adaptive`` configuration."""

from benchmarks.dyn_successor_ablation import VARIANTS, parse_arguments
from dyntta.methods.dyn_adaptive import DYNAdaptiveConfig


def test_repeated_sets_all_apply():
    args = parse_arguments(["--grid", "g.toml", "--out", "o.jsonl", "--set", "seeds=[0]",
                            "--set", "stream.batch_sizes=[64]", "a=1"])
    assert args.overrides == ["seeds=[0]", "stream.batch_sizes=[64]", "a=1"]
    assert parse_arguments(["--grid", "g.toml", "--out", "o.jsonl"]).overrides == []


def test_every_variant_is_a_valid_dyn_adaptive_config():
    for options in VARIANTS.values():
        DYNAdaptiveConfig(**options)  # an unknown option or an invalid value raises
