"""``dyntta refresh`` writes the model with its BN statistics re-estimated on the chosen rows of
an .npz's images: the library's :func:`refresh_statistics` of exactly those rows, as a checkpoint
that loads as the model did (a dyntta checkpoint, or a state dict for a factory's model).
``dyntta calibrate`` prints the library's source-weight reading of those rows, and the options it
chose as a grid accepts them."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dyntta.bench import sources
from dyntta.bench.config import load_grid
from dyntta.cli import main
from dyntta.data.digits import load_digits_split
from dyntta.methods.source_weights import TABLE_HEADER, calibrate_source_weights, table_rows
from dyntta.models import load_checkpoint, refresh_statistics, save_checkpoint
from dyntta.models.factory import build_from_factory
from tests.bench.helpers import USER_MODULE
from tests.conftest import tiny_resnet

@pytest.fixture
def folder(tmp_path, monkeypatch):
    """12 random images (``clean.npz``, no labels: refreshing needs none), the tiny ResNet as a dyntta checkpoint (``tiny.pt``)
    and as a state dict (``state.pt``) of the factory ``usermodels:tiny``; the current folder."""
    images = np.random.default_rng(2).integers(0, 256, (12, 8, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "clean.npz", x=images)
    save_checkpoint(tiny_resnet(), tmp_path / "tiny.pt")
    torch.save(tiny_resnet().state_dict(), tmp_path / "state.pt")
    (tmp_path / "usermodels.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    yield images
    sys.modules.pop("usermodels", None)


def as_floats(images: np.ndarray) -> torch.Tensor:  # an independent reading of the conversion
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255


def assert_same_state(written: dict, expected: dict) -> None:
    assert written.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(written[name], value, rtol=0, atol=0, msg=name)


def test_a_checkpoint_refreshed_on_the_even_rows(folder):
    assert main(["refresh", "clean.npz", "--checkpoint", "tiny.pt", "--rows", "even",
                 "--out", "refreshed.pt"]) == 0
    expected = refresh_statistics(tiny_resnet(), as_floats(folder[0::2]))
    written = load_checkpoint("refreshed.pt")
    assert_same_state(written.state_dict(), expected.state_dict())
    x = torch.rand(2, 3, 8, 8)
    with torch.no_grad():
        assert not torch.allclose(written(x), tiny_resnet()(x))  # not the source model


@pytest.mark.parametrize("model", [[], ["--model", "usermodels:tiny"]], ids=["dyntta", "factory"])
def test_the_same_refresh_writes_the_same_bytes(folder, model):
    """The file's sha256 names the model in every record that runs it: two runs of one command
    write one file, byte for byte (nothing of the temporary file's name inside)."""
    checkpoint = "state.pt" if model else "tiny.pt"
    for out in ("first.pt", "second.pt"):
        assert main(["refresh", "clean.npz", *model, "--checkpoint", checkpoint,
                     "--out", out]) == 0
    assert Path("first.pt").read_bytes() == Path("second.pt").read_bytes()


def test_images_takes_the_seeds_random_draw_of_the_rows(folder):
    for seed in (0, 1):
        assert main(["refresh", "clean.npz", "--checkpoint", "tiny.pt", "--rows", "odd",
                     "--images", "4", "--seed", str(seed), "--out", f"{seed}.pt"]) == 0
    for seed in (0, 1):  # the first 4 of the seed's permutation of the 6 odd rows
        rows = torch.randperm(6, generator=torch.Generator().manual_seed(seed))[:4].numpy()
        expected = refresh_statistics(tiny_resnet(), as_floats(folder[1::2][rows]))
        assert_same_state(load_checkpoint(f"{seed}.pt").state_dict(), expected.state_dict())
    first, second = (load_checkpoint(f"{s}.pt").state_dict() for s in (0, 1))
    assert any(not torch.equal(first[k], second[k]) for k in first if "running_mean" in k)


def test_a_factorys_model_is_written_as_a_state_dict_it_loads(folder):
    assert main(["refresh", "clean.npz", "--model", "usermodels:tiny", "--checkpoint",
                 "state.pt", "--out", "mine.pt"]) == 0
    written = torch.load("mine.pt", weights_only=True)
    expected = refresh_statistics(build_from_factory("usermodels:tiny", "state.pt"),
                                  as_floats(folder))
    assert_same_state(written, expected.state_dict())
    assert_same_state(build_from_factory("usermodels:tiny", "mine.pt").state_dict(), written)


def test_more_images_than_the_rows_hold_is_one_error_line(folder, capsys):
    assert main(["refresh", "clean.npz", "--checkpoint", "tiny.pt", "--rows", "even",
                 "--images", "7", "--out", "out.pt"]) == 2
    assert capsys.readouterr().err == \
        "dyntta refresh: error: --images 7: the even rows of clean.npz hold 6\n"
    assert not Path("out.pt").exists()


def test_images_that_are_not_uint8_rgb_are_one_error_line(folder, capsys):
    np.savez("floats.npz", x=folder.astype(np.float32) / 255, y=np.zeros(12, dtype=np.int64))
    assert main(["refresh", "floats.npz", "--checkpoint", "tiny.pt", "--out", "out.pt"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dyntta refresh: error: floats.npz (x): expected uint8 images") and \
        len(err.splitlines()) == 1


def test_an_npz_without_images_is_one_error_line_naming_the_array(folder, capsys):
    np.savez("labels.npz", y=np.zeros(12, dtype=np.int64))
    assert main(["refresh", "labels.npz", "--checkpoint", "tiny.pt", "--out", "out.pt"]) == 2
    assert capsys.readouterr().err == \
        "dyntta refresh: error: labels.npz: missing arrays ['x']; it holds ['y']\n"


@pytest.fixture
def digits(tmp_path, monkeypatch):
    """The digits test split (``digits.npz``), the shipped digits ResNet-20 (``model.pt``) and
    the same with stale statistics (``stale.pt``: every running variance 25 times too large, as
    if estimated on images of five times the contrast); the current folder."""
    _, _, x, y = load_digits_split()
    np.savez(tmp_path / "digits.npz", x=x, y=y)
    model = load_checkpoint(Path(sources.__file__).parent / sources.DIGITS_MODEL)
    save_checkpoint(model, tmp_path / "model.pt")
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_var *= 25
    save_checkpoint(model, tmp_path / "stale.pt")
    monkeypatch.chdir(tmp_path)
    return x, y


def tbn_accuracy(model, x, y, batch_size, seed=0) -> float:
    """An independent reading of TBN: the model's BN layers in training mode (batch
    statistics), batches of the seed's permutation of the rows."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.train()
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed)).numpy()
    hits = 0
    with torch.no_grad():
        for start in range(0, len(y), batch_size):
            rows = order[start : start + batch_size]
            hits += int((model(as_floats(x[rows])).argmax(1) == torch.from_numpy(y[rows])).sum())
    return 100 * hits / len(y)


def test_check_reads_stale_statistics_and_a_refresh_mends_them(digits, capsys):
    x, y = digits
    lines = {}
    for name in ("model", "stale", "refreshed"):
        if name == "refreshed":
            assert main(["refresh", "digits.npz", "--checkpoint", "stale.pt", "--out",
                         "refreshed.pt"]) == 0
            capsys.readouterr()
        assert main(["refresh", "digits.npz", "--checkpoint", f"{name}.pt", "--check",
                     "--batch-size", "64"]) == 0
        lines[name] = capsys.readouterr().out
        model = load_checkpoint(f"{name}.pt")
        with torch.no_grad():
            source = 100 * float((model(as_floats(x)).argmax(1) == torch.from_numpy(y)).float()
                                 .mean())
        assert f"its own BN statistics {source:.1f}%" in lines[name]
        assert f"(TBN, batches of 64) {tbn_accuracy(model, x, y, 64):.1f}%" in lines[name]
    assert lines["stale"].rstrip().endswith("refresh them (without --check)")
    for name in ("model", "refreshed"):
        assert lines[name].rstrip().endswith("as well as each batch's own or better")
    assert sorted(p.name for p in Path().iterdir() if p.suffix == ".pt") == \
        ["model.pt", "refreshed.pt", "stale.pt"]  # --check wrote nothing


def test_check_needs_labels_and_refreshing_needs_an_out(folder, capsys):
    assert main(["refresh", "clean.npz", "--checkpoint", "tiny.pt", "--check"]) == 2
    assert "missing arrays ['y']" in capsys.readouterr().err
    assert main(["refresh", "clean.npz", "--checkpoint", "tiny.pt"]) == 2
    assert "give --out (the checkpoint to write) or --check" in capsys.readouterr().err


def test_calibrate_prints_the_librarys_reading_of_the_drawn_rows(folder, capsys):
    assert main(["calibrate", "clean.npz", "--checkpoint", "tiny.pt", "--rows", "odd",
                 "--images", "5", "--seed", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = torch.randperm(6, generator=torch.Generator().manual_seed(1))[:5].numpy()
    expected = calibrate_source_weights(tiny_resnet(), as_floats(folder[1::2][rows]), seed=1)
    assert out[:4] == [*TABLE_HEADER.splitlines(), *table_rows(expected, "tiny.pt")]
    grid_line = next(line for line in out if "[[datasets]]" in line).split(": ", 1)[1]
    options = ", ".join(f"{k}={v!r}" for k, v in expected.options.items())
    assert out[-1] == f'in Python: dyntta.adapt(model, "dyn_adaptive", {options})'
    # the printed line, pasted into a grid's dataset entry, sets those options on its cells
    grid = Path("grid.toml")
    grid.write_text(f'methods = ["dyn_adaptive"]\n[[datasets]]\nname = "digits"\n{grid_line}\n')
    assert {c.options for c in load_grid(grid).cells()} == {tuple(sorted(expected.options.items()))}


def test_calibrate_with_labels_needs_them_and_reads_them(folder, capsys):
    assert main(["calibrate", "clean.npz", "--checkpoint", "tiny.pt", "--labels"]) == 2
    assert "missing arrays ['y']" in capsys.readouterr().err
    labels = np.arange(12) % 3
    np.savez("labelled.npz", x=folder, y=labels)
    assert main(["calibrate", "labelled.npz", "--checkpoint", "tiny.pt", "--labels"]) == 0
    expected = calibrate_source_weights(tiny_resnet(), as_floats(folder),
                                        torch.from_numpy(labels))
    assert capsys.readouterr().out.splitlines()[2:4] == table_rows(expected, "tiny.pt")


def test_calibrate_reads_at_the_batch_size_given(folder, capsys):
    assert main(["calibrate", "clean.npz", "--checkpoint", "tiny.pt", "--batch-size", "5"]) == 0
    expected = calibrate_source_weights(tiny_resnet(), as_floats(folder), batch_size=5)
    assert expected != calibrate_source_weights(tiny_resnet(), as_floats(folder))  # it matters
    assert capsys.readouterr().out.splitlines()[2:4] == table_rows(expected, "tiny.pt")
