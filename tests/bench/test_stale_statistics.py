"""``dyntta bench`` on an ``npz`` dataset says, in one warning line, when the model's own BN
statistics do not describe the dataset's clean images (they score below each batch's, TBN,
beyond the paired interval), and says nothing when they do."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from dyntta.bench import sources
from dyntta.bench.config import DatasetEntry
from dyntta.bench.sources import (
    STALE_CHECK_ROWS, SourceOptions, resolve_source, warn_if_stale)
from dyntta.cli import main
from dyntta.models import load_checkpoint, statistics_hits
from tests.models.test_refresh_cli import as_floats, digits  # noqa: F401 (a fixture)

GRID = """title = "stale"
seeds = [0]
methods = ["source", "tbn"]
[stream]
scenarios = ["continual"]
batch_sizes = [64]
n_domains = [1]
n_samples = 64
[[datasets]]
name = "npz"
path = "digits.npz"
"""


def test_the_bench_warns_of_statistics_that_do_not_describe_the_clean_images(digits, capfd):
    x, y = digits
    with open("grid.toml", "w") as f:
        f.write(GRID)
    errors = {}
    for name, workers in (("model", "1"), ("stale", "2")):  # worker processes do not repeat it
        assert main(["bench", "--config", "grid.toml", "--no-progress", "--cache-dir", "cache",
                     "--checkpoint", f"{name}.pt", "--out", f"run-{name}",
                     "--workers", workers]) == 0
        errors[name] = capfd.readouterr().err  # the workers' too
    assert errors["model"] == ""
    lines = errors["stale"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("dyntta bench: warning: dataset 'npz' with "
                                                   "model stale.pt: on 448 of its clean images")
    assert lines[0].endswith("re-estimate them first (dyntta refresh, docs/models.md)")
    # the source's accuracy it prints, read directly: the seed-0 draw of whole batches of 64
    rows = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[:448].numpy()
    assert 448 == min(len(x), STALE_CHECK_ROWS) // 64 * 64
    with torch.no_grad():
        logits = load_checkpoint("stale.pt")(as_floats(x[rows]))
    source = 100 * float((logits.argmax(1) == torch.from_numpy(y[rows])).float().mean())
    assert f"the model scores {source:.1f}% with its own BN statistics" in lines[0]


def test_too_few_clean_images_are_not_judged(digits, capsys):
    x, y = digits
    np.savez("digits.npz", x=x[:255], y=y[:255])  # under 4 batches of 64
    with open("grid.toml", "w") as f:
        f.write(GRID)
    assert main(["bench", "--config", "grid.toml", "--no-progress", "--cache-dir", "cache",
                 "--checkpoint", "stale.pt", "--out", "run"]) == 0
    assert capsys.readouterr().err == ""


def test_a_model_without_running_statistics_is_not_judged():
    """Nothing to be stale (and TBN would refuse the model): no check, no error."""
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (256, 8, 8, 3), dtype=np.uint8), rng.integers(0, 3, 256)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_stale(model, x, y, "a model")


def test_a_quiet_resolution_does_not_check(digits, monkeypatch):
    """A worker process resolves the source the run's own process has checked: no second
    check (two forwards over the clean images), no warning."""
    def counted(*args, **kwargs):
        calls.append(1)
        return statistics_hits(*args, **kwargs)

    calls = []
    monkeypatch.setattr(sources, "statistics_hits", counted)
    entry, options = DatasetEntry("npz", "digits.npz", "stale.pt"), SourceOptions(
        cache_dir="cache", severities=(5,), domains=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_source(entry, options, progress=False, quiet=True)
    assert calls == []
    with pytest.warns(UserWarning, match="do not describe these images"):
        resolve_source(entry, options, progress=False)
    assert calls == [1]
