"""`dyntta bench`, `dyntta report` and `dyntta train` from the command line, end to end on tiny
data, and the errors they give for bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dyntta.bench.config import DatasetEntry
from dyntta.bench.results import read_results
from dyntta.bench.sources import SourceOptions, resolve_source
from dyntta.cli import main
from dyntta.data import CORRUPTIONS, NpyCorruptedDataset, build_corrupted
from dyntta.models import load_checkpoint, save_checkpoint
from tests.conftest import tiny_resnet


@pytest.fixture
def npz_and_checkpoint(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "clean.npz", x=rng.integers(0, 256, (24, 32, 32, 3), dtype=np.uint8),
             y=rng.integers(0, 3, 24))
    save_checkpoint(tiny_resnet(), tmp_path / "tiny.pt", classes=["a", "b", "c"])
    return tmp_path


def tiny_bench(d, n_domains: int) -> list[str]:
    """``dyntta bench`` arguments for a CrossMix grid (B = 8) on the fixture's npz and model."""
    grid = d / "grid.toml"
    grid.write_text('title = "tiny"\n[stream]\nscenarios = ["crossmix"]\nbatch_sizes = [8]\n'
                    f'n_domains = [{n_domains}]\n[[datasets]]\nname = "npz"\n'
                    'path = "clean.npz"\ncheckpoint = "tiny.pt"\n')
    return ["bench", "--config", str(grid), "--data-dir", str(d), "--cache-dir",
            str(d / "cache"), "--no-progress"]


def test_bench_then_report_on_a_built_npz_set(npz_and_checkpoint, capsys):
    d = npz_and_checkpoint
    args = [*tiny_bench(d, n_domains=3), "--out", str(d / "run"), "--methods", "source", "dyn"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| source |" in out and "| dyn |" in out and "results and report in" in out
    records = read_results(d / "run" / "results.jsonl")
    assert sorted(r["config"]["method"] for r in records) == ["dyn", "source"]
    assert all(r["n_samples"] == 72 for r in records)  # 24 images x 3 domains
    [built] = (d / "cache" / "built").iterdir()  # only what the streams read: 3 domains
    assert sorted(p.name for p in built.glob("*.npy")) == sorted(
        [f"{c}.npy" for c in CORRUPTIONS[:3]] + ["labels.npy"])
    assert (d / "run" / "table.md").is_file() and (d / "run" / "accuracy_per_domain.png").is_file()
    assert main(args) == 0  # resumed: nothing left to run, same records
    assert len(read_results(d / "run" / "results.jsonl")) == 2
    assert main(["report", str(d / "run" / "results.jsonl"), "--out", str(d / "rep")]) == 0
    assert (d / "rep" / "table.csv").read_text().count("\n") == 3


def test_bench_compile_runs_compiled_and_records_it(npz_and_checkpoint, capsys):
    d = npz_and_checkpoint
    base = [*tiny_bench(d, n_domains=2), "--set", "stream.n_samples=8", "--methods", "dyn"]
    assert main([*base, "--out", str(d / "eager")]) == 0
    assert main([*base, "--compile", "--set", 'compile={backend="eager"}',  # --set wins
                 "--out", str(d / "compiled")]) == 0
    eager, compiled = (read_results(d / run / "results.jsonl")[0] for run in ("eager", "compiled"))
    assert eager["config"]["compile"] is False
    assert compiled["config"]["compile"] == {"backend": "eager"}
    assert compiled["batch_correct"] == eager["batch_correct"]


def test_bench_compile_flag_sets_the_grids_compile(monkeypatch, tmp_path):
    import dyntta.bench.api

    def stop(grid, *args, **kwargs):
        raise SystemExit(f"compile={grid.compile}")

    monkeypatch.setattr(dyntta.bench.api, "run_grid", stop)
    with pytest.raises(SystemExit, match="compile=True"):
        main(["bench", "--compile", "--no-progress", "--out", str(tmp_path)])


def test_bench_on_an_imagenet_c_folder_with_torchvision_resnet_weights(tmp_path, capsys):
    """ImageNet-C's layout and a state dict with torchvision's ResNet names, end to end."""
    import torch
    from PIL import Image

    from dyntta.models import build

    rng = np.random.default_rng(0)
    for corruption in ("gaussian_noise", "shot_noise", "impulse_noise"):  # the first 3 domains
        for wnid in ("n01", "n02"):
            folder = tmp_path / "ImageNet-C" / corruption / "5" / wnid
            folder.mkdir(parents=True)
            for k in range(4):
                image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(image).save(folder / f"{k}.JPEG")
    state = build("resnet18-imagenet", num_classes=2).state_dict()
    state = {k.replace("linear.", "fc.").replace("downsample.conv.", "downsample.0.")
             .replace("downsample.bn.", "downsample.1."): v for k, v in state.items()}
    torch.save(state, tmp_path / "resnet18.pth")
    args = ["bench", "--dataset", "imagenet-c", "--data-dir", str(tmp_path),
            "--checkpoint", "resnet18.pth", "--set", "stream.batch_sizes=[8]",
            "--set", "stream.n_domains=[3]", "--set", 'stream.scenarios=["crossmix"]',
            "--out", str(tmp_path / "run"), "--methods", "tbn", "dyn", "--no-progress"]
    assert main(args) == 0
    records = read_results(tmp_path / "run" / "results.jsonl")
    assert sorted(r["config"]["method"] for r in records) == ["dyn", "tbn"]
    assert all(r["n_samples"] == 24 and len(r["per_domain"]) == 3
               for r in records)
    args[args.index(str(tmp_path / "run"))] = str(tmp_path / "cut")
    assert main([*args, "--set", "stream.n_samples=5"]) == 0  # an explicit cut still applies
    assert {r["n_samples"] for r in read_results(tmp_path / "cut" / "results.jsonl")} == {15}


def test_train_writes_a_checkpoint_that_loads(npz_and_checkpoint):
    d = npz_and_checkpoint
    assert main(["train", "--npz", str(d / "clean.npz"), "--arch", "resnet20", "--epochs", "1",
                 "--out", str(d / "m.pt"), "--no-progress"]) == 0
    model = load_checkpoint(d / "m.pt")
    assert model.classes == ["0", "1", "2"]


def test_training_is_deterministic(npz_and_checkpoint):
    from dyntta.bench.train import train_classifier

    with np.load(npz_and_checkpoint / "clean.npz") as blob:
        x, y = blob["x"][:16], blob["y"][:16]
    a, b = (train_classifier(x, y, "resnet20", epochs=1, batch_size=8, progress=False)
            for _ in range(2))
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert np.array_equal(va.numpy(), vb.numpy()), k


@pytest.mark.parametrize("kwargs, words", [
    ({"epochs": 0}, "epochs >= 1"),  # would save an untrained model
    ({"batch_size": 1}, "batch_size >= 2"),  # every step skipped: untrained too
    ({"lr": 0.0}, "lr > 0"),
    ({"labels": -np.ones(16, dtype=np.int64)}, "training labels: labels must be >= 0"),
])
def test_training_that_would_not_train_is_refused(kwargs, words):
    from dyntta.bench.train import train_classifier

    args = {"images": np.zeros((16, 8, 8, 3), np.uint8), "labels": np.arange(16) % 2,
            "progress": False, **kwargs}
    with pytest.raises(ValueError, match=re.escape(words)):
        train_classifier(**args)


def test_npz_of_another_image_size_is_corrupted_with_the_recipe_given(npz_and_checkpoint, capsys):
    """Images neither 32x32 nor 224x224 have no recipe by size: the bench says how to give one,
    and ``--recipe`` reaches the build (the cached set is the library's build with that recipe,
    not the other's)."""
    d = npz_and_checkpoint
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 256, (6, 20, 28, 3), dtype=np.uint8), rng.integers(0, 3, 6)
    np.savez(d / "odd.npz", x=x, y=y)
    args = ["bench", "--dataset", "npz", "--dataset-path", str(d / "odd.npz"), "--checkpoint",
            str(d / "tiny.pt"), "--methods", "tbn", "--set", 'stream.scenarios=["crossmix"]',
            "--set", "stream.batch_sizes=[8]", "--cache-dir", str(d / "cache"), "--no-progress",
            "--out", str(d / "run")]
    assert main(args) == 2
    assert "--recipe on the command line" in capsys.readouterr().err
    assert main([*args, "--recipe", "imagenet"]) == 0
    [built] = (d / "cache" / "built").iterdir()
    assert built.name.endswith("-imagenet")
    for recipe, same in (("imagenet", True), ("cifar", False)):
        direct = build_corrupted(x, y, d / recipe, severities=[5], seed=0,
                                 progress=False, recipe=recipe)
        equal = [np.array_equal(direct.images(c, 5), NpyCorruptedDataset(built).images(c, 5))
                 for c in ("gaussian_noise", "glass_blur", "frost")]
        assert equal == [same] * 3, recipe
    [record] = read_results(d / "run" / "results.jsonl")
    assert record["config"]["dataset"]["recipe"] == "imagenet"


def test_recipe_only_for_npz_and_only_a_known_one(npz_and_checkpoint, capsys):
    d = npz_and_checkpoint
    for command in (["bench", "--no-progress"], ["analyze", "alpha-sweep"]):
        assert main([*command, "--dataset", "cifar10-c", "--recipe", "cifar"]) == 2
        assert "--recipe is for --dataset npz" in capsys.readouterr().err
    base = [*tiny_bench(d, n_domains=1), "--out", str(d / "run")]
    for dataset, message in (('{name = "npz", path = "clean.npz", recipe = "svhn"}',
                              "unknown recipe 'svhn'; valid: cifar, imagenet"),
                             ('{name = "cifar10-c", recipe = "cifar"}',
                              "recipe is for 'npz'")):
        assert main([*base, "--set", f"datasets=[{dataset}]"]) == 2
        assert message in capsys.readouterr().err


def test_labels_beyond_the_models_classes_are_refused_before_building(npz_and_checkpoint):
    d = npz_and_checkpoint
    np.savez(d / "ten.npz", x=np.zeros((4, 32, 32, 3), np.uint8), y=np.array([0, 1, 2, 3]))
    options = SourceOptions(data_dir=str(d), cache_dir=str(d / "cache"))
    with pytest.raises(ValueError, match=re.escape("labels go up to 3 but the model has 3 "
                                                   "classes (0..2)")):
        resolve_source(DatasetEntry("npz", "ten.npz", "tiny.pt"), options, progress=False)
    assert not (d / "cache").exists()


@pytest.mark.parametrize(
    "entry, options, error, message",
    [
        (DatasetEntry("mnist"), SourceOptions(), ValueError, "unknown dataset 'mnist'; valid: digits"),
        (DatasetEntry("cifar10-c"), SourceOptions(), ValueError, "needs a model: give --checkpoint"),
        (DatasetEntry("cifar10-c", checkpoint="no-such-m.pt"), SourceOptions(),
         FileNotFoundError, "checkpoint not found: no-such-m.pt"),  # relative to the cwd
        (DatasetEntry("npz", path="clean.npz"), SourceOptions(checkpoint="/nonexistent/m.pt"),
         FileNotFoundError, "checkpoint not found: /nonexistent/m.pt"),
    ],
)
def test_bad_sources_are_clear_errors(entry, options, error, message):
    with pytest.raises(error, match=message):
        resolve_source(entry, options, progress=False)


def test_missing_dataset_folder_names_path_and_layout(npz_and_checkpoint):
    d = npz_and_checkpoint
    options = SourceOptions(data_dir=str(d), checkpoint="tiny.pt")
    with pytest.raises(FileNotFoundError, match=r"CIFAR-10-C not found \(expected <corruption>.npy"):
        resolve_source(DatasetEntry("cifar10-c"), options, progress=False)
    with pytest.raises(FileNotFoundError, match="npz dataset not found"):
        resolve_source(DatasetEntry("npz", path="none.npz"), options, progress=False)


def test_cli_reports_bad_input_as_an_error_message(tmp_path, capsys):
    assert main(["report", str(tmp_path / "none.jsonl")]) == 2
    assert "results file not found" in capsys.readouterr().err
    assert main(["bench", "--methods", "magic", "--no-progress", "--out", str(tmp_path)]) == 2
    assert "unknown method 'magic'; available:" in capsys.readouterr().err


def test_checkpoint_option_replaces_the_shipped_digits_model(tmp_path, monkeypatch, capsys):
    """``--checkpoint`` on the embedded grid is used, not ignored: a missing file is named, and
    a relative path starts from the current folder."""
    monkeypatch.chdir(tmp_path)
    args = ["bench", "--checkpoint", "nope.th", "--out", str(tmp_path / "run"), "--no-progress",
            "--cache-dir", str(tmp_path / "cache")]
    assert main(args) == 2
    assert "error: checkpoint not found: nope.th" in capsys.readouterr().err
