"""Any model in the bench: a factory named by its import path (``dyntta bench --model``, the
grid's ``model`` field) and a model object (``dyntta.bench.run``) give the records the same
weights give through dyntta's own checkpoint format; what the bench refuses, one line each."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dyntta.bench
from dyntta.bench import sources
from dyntta.bench.config import DatasetEntry
from dyntta.bench.sources import SourceOptions, resolve_source
from dyntta.data.digits import load_digits_split
from dyntta.bench.results import read_results
from dyntta.cli import main
from dyntta.models import save_checkpoint
from tests.bench.helpers import NPZ_GRID_TOML, USER_MODULE
from tests.conftest import tiny_resnet

SRC = Path(__file__).resolve().parents[2] / "src"

GRID = NPZ_GRID_TOML.replace('checkpoint = "tiny.pt"\n', "")  # the model comes from elsewhere


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A tiny 3-class set, the tiny ResNet's weights as a dyntta checkpoint (``tiny.pt``) and as
    a bare state dict (``state.pt``), the user's module ``usermodels.py`` and a grid over the
    set; the current folder for the test."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "clean.npz", x=rng.integers(0, 256, (24, 32, 32, 3), dtype=np.uint8),
             y=rng.integers(0, 3, 24))
    save_checkpoint(tiny_resnet(), tmp_path / "tiny.pt", classes=["a", "b", "c"])
    torch.save(tiny_resnet().state_dict(), tmp_path / "state.pt")
    (tmp_path / "usermodels.py").write_text(USER_MODULE)
    (tmp_path / "grid.toml").write_text(GRID)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("usermodels", None)


def run_dyntta(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``dyntta ARGS`` (this tree's package) in ``cwd``; output captured as text."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "DYNTTA_CACHE": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-m", "dyntta.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def outcome(records: list[dict]) -> dict:
    """Per method: what a run measured (accuracies, per-batch hits, the rows streamed)."""
    return {r["config"]["method"]: (r["accuracy"], r["per_domain"], r["batch_correct"],
                                    r["batch_n"], r["rows_fingerprint"]) for r in records}


def test_factory_and_model_object_give_the_records_of_the_zoo_checkpoint(folder):
    bench = ["bench", "--config", "grid.toml", "--no-progress", "--cache-dir", "cache"]
    zoo = run_dyntta(*bench, "--checkpoint", "tiny.pt", "--out", "zoo", cwd=folder)
    assert zoo.returncode == 0, zoo.stderr
    own = run_dyntta(*bench, "--model", "usermodels:tiny", "--checkpoint", "state.pt", "--out",
                 "own", cwd=folder)
    assert own.returncode == 0, own.stderr
    zoo_records, own_records = (read_results(folder / run / "results.jsonl")
                                for run in ("zoo", "own"))
    assert len(zoo_records) == 3 and outcome(own_records) == outcome(zoo_records)
    sha = hashlib.sha256((folder / "state.pt").read_bytes()).hexdigest()
    assert {(r["model_factory"], r["checkpoint_sha256"]) for r in own_records} == {
        ("usermodels:tiny", sha)}
    assert own.stdout.split("\n\n", 1)[1].replace("own/", "zoo/") == \
        zoo.stdout.split("\n\n", 1)[1]  # the same table

    model = tiny_resnet().train()  # left as it was: mode and weights
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run = dyntta.bench.run("grid.toml", model=model, name="mine", out="object",
                           cache_dir="cache")
    assert model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert outcome(run.records) == outcome(zoo_records)
    assert {r["model"] for r in run.records} == {"mine"} and run.out == Path("object")
    assert (folder / "object" / "table.md").read_text().endswith(run.table)

    grid_field = {"title": "own model", "methods": ["source", "tbn", "dyn"],
                  "stream": {"scenarios": ["crossmix"], "batch_sizes": [8], "n_domains": [3]},
                  "datasets": [{"name": "npz", "path": "clean.npz", "model": "usermodels:tiny",
                                "checkpoint": "state.pt"}]}
    run = dyntta.bench.run(grid_field, out="field", cache_dir="cache")
    assert outcome(run.records) == outcome(zoo_records)


def test_the_reference_is_the_first_clean_images_of_the_npz_or_the_digits_training_split(
        folder, monkeypatch):
    """The clean images dyn_adaptive reads: an ``npz`` file's first ``REFERENCE_IMAGES``, none
    below one group of 32; the digits' training split."""
    x = np.random.default_rng(1).integers(0, 256, (40, 32, 32, 3), dtype=np.uint8)
    np.savez(folder / "forty.npz", x=x, y=np.arange(40) % 3)
    options = SourceOptions(cache_dir=str(folder / "cache"))
    monkeypatch.setattr(sources, "REFERENCE_IMAGES", 36)
    source = resolve_source(DatasetEntry("npz", path="forty.npz", checkpoint="tiny.pt"),
                            options, progress=False)
    assert np.array_equal(source.reference, x[:36])
    few = resolve_source(DatasetEntry("npz", path="clean.npz", checkpoint="tiny.pt"), options,
                         progress=False)
    assert len(few.dataset.labels) == 24 and few.reference is None
    digits = resolve_source(DatasetEntry("digits"), options, progress=False)
    assert np.array_equal(digits.reference, load_digits_split()[0])


def test_an_analysis_of_a_factorys_model_on_the_npz_a_bench_built(folder):
    """``dyntta analyze --model`` takes the user's factory as ``bench`` does, on the same data,
    and the two share the cache although a bench builds one severity and an analysis all five:
    its results equal those of the zoo checkpoint of the same weights."""
    bench = run_dyntta("bench", "--config", "grid.toml", "--no-progress", "--cache-dir",
                       "cache", "--model", "usermodels:tiny", "--checkpoint", "state.pt",
                       "--methods", "tbn", "--out", "run", cwd=folder)
    assert bench.returncode == 0, bench.stderr
    analyze = ["analyze", "alpha-sweep", "--dataset", "npz", "--dataset-path", "clean.npz",
               "--cache-dir", "cache", "--n-samples", "8", "--alphas", "0", "0.8",
               "--no-progress"]
    for model, out in ((["--model", "usermodels:tiny", "--checkpoint", "state.pt"], "own"),
                       (["--checkpoint", "tiny.pt"], "zoo")):
        done = run_dyntta(*analyze, *model, "--out", out, cwd=folder)
        assert done.returncode == 0, done.stderr
    rows = [[{k: v for k, v in row.items() if k != "model"} for row in
             map(json.loads, (folder / out / "alpha-sweep.jsonl").read_text().splitlines())]
            for out in ("own", "zoo")]
    assert rows[0] == rows[1] and len(rows[0]) >= 2


BAD_MODELS = {
    # --model: words of the one error line
    "nosuchmodule:build": "model factory 'nosuchmodule:build': cannot import 'nosuchmodule'",
    "usermodels": "must look like package.module:function",
    "usermodels:missing": "'usermodels' has no 'missing'",
    "usermodels:not_callable": "is a int, not callable",
    "usermodels:not_a_module": "returned a str, not a torch.nn.Module",
    "usermodels:flat": "the model must return logits (B, classes) for images (B, 3, H, W) in "
                       "[0, 1]; for (4, 3, 32, 32) it returned a torch.float32 tensor of shape (12,)",
    "usermodels:two_classes": "labels go up to 2 but the model has 2 classes",
}


@pytest.mark.parametrize("factory", BAD_MODELS)
def test_a_bad_factory_is_one_error_line(folder, factory, capsys):
    args = ["bench", "--config", "grid.toml", "--no-progress", "--cache-dir", "cache",
            "--model", factory, "--out", "run"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("dyntta bench: error: ") and err.count("\n") == 1
    assert BAD_MODELS[factory] in err


def test_a_bad_factory_through_the_command_has_no_traceback(folder):
    done = run_dyntta("bench", "--config", "grid.toml", "--model", "usermodels:not_a_module",
                  "--no-progress", cwd=folder)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "dyntta bench: error: model factory 'usermodels:not_a_module' returned a str, not a "
        "torch.nn.Module"]


def test_a_model_that_returns_probabilities_is_warned_about_once(folder, capsys):
    args = ["bench", "--config", "grid.toml", "--no-progress", "--cache-dir", "cache", "--out"]
    assert main([*args, "soft", "--model", "usermodels:softmaxed"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: the model's outputs are non-negative and sum to 1 per row") == 1
    assert err.count("\n") == 1 and "expect logits" in err
    assert main([*args, "logits", "--model", "usermodels:tiny"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_warning_in_a_worker_process_is_one_line(folder, capfd):
    # the same weights in every process: the tiny ResNet's, under the softmax
    torch.save({f"0.{k}": v for k, v in tiny_resnet().state_dict().items()}, "soft.pt")
    args = ["bench", "--config", "grid.toml", "--no-progress", "--cache-dir", "cache", "--out",
            "soft", "--model", "usermodels:softmaxed", "--checkpoint", "soft.pt", "--workers", "2"]
    assert main(args) == 0
    lines = capfd.readouterr().err.splitlines()  # the workers' stderr too
    assert any(line.startswith("dyntta worker: warning: the model's outputs are non-negative")
               for line in lines)
    assert all(line.startswith(("dyntta bench: warning: ", "dyntta worker: warning: "))
               for line in lines)


def test_bad_arguments_of_the_python_entry_point(folder):
    with pytest.raises(ValueError, match="model must be a torch.nn.Module, a factory's import"):
        dyntta.bench.run("grid.toml", model=3)
    with pytest.raises(ValueError, match="load the weights into a model object yourself"):
        dyntta.bench.run("grid.toml", model=tiny_resnet(), checkpoint="state.pt")
    with pytest.raises(ValueError, match="name= names a model object"):
        dyntta.bench.run("grid.toml", model="usermodels:tiny", name="x")
