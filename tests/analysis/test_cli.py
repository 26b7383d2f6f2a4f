"""``dyntta analyze``: results file first, figure drawn from it; errors exit with code 2."""

from __future__ import annotations

import pytest

from dyntta.analysis import cli as analysis_cli
from dyntta.analysis.common import Subject, read_rows, write_rows
from dyntta.cli import main
from tests.analysis.conftest import toy_dataset
from tests.conftest import tiny_resnet

SMALL = ["--batch-size", "12", "--n-samples", "8"]
EXTRA = {
    "tbn-in-distance": ["--severities", "1", "5"],
    "patch-shuffle": ["--grids", "1", "2"],
    "alpha-sweep": ["--alphas", "0", "1"],
    "clustering": ["--clusterings", "lisc", "kmeans"],
    "clusters-per-layer": [],
}


@pytest.fixture
def tiny_subject(monkeypatch):
    subject = Subject(tiny_resnet(), toy_dataset(), "tiny-resnet", "toy")
    seen = []

    def load(args):
        seen.append(args)
        return subject

    monkeypatch.setattr(analysis_cli, "load_subject", load)
    return seen


def test_every_analysis_is_a_sub_command():
    assert set(EXTRA) == set(analysis_cli.ANALYSES)


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_analysis_writes_results_then_figure(name, tmp_path, tiny_subject, capsys):
    assert main(["analyze", name, "--out", str(tmp_path), *SMALL, *EXTRA[name]]) == 0
    rows = read_rows(tmp_path / f"{name}.jsonl")
    assert {(r["analysis"], r["model"], r["dataset"]) for r in rows} == {
        (name, "tiny-resnet", "toy")}
    assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{name}.png" in capsys.readouterr().out
    figure = analysis_cli.ANALYSES[name].plot(rows)
    # the suptitle is one of the figure's texts (get_suptitle only from matplotlib 3.8)
    assert any("tiny-resnet on toy" in text.get_text() for text in figure.texts)
    for axes in figure.axes:
        assert axes.get_xlabel() and axes.get_ylabel() and axes.get_title()
        assert axes.get_legend() is not None


def test_stream_options_reach_the_analysis(tmp_path, tiny_subject):
    argv = ["analyze", "clusters-per-layer", "--out", str(tmp_path), "--batch-size", "5",
            "--n-samples", "all", "--corruptions", "contrast", "brightness", "--seed", "3"]
    assert main(argv) == 0
    stream = read_rows(tmp_path / "clusters-per-layer.jsonl")[0]["stream"]
    assert "crossmix, 2 domains, severity 5, B=5, all rows/domain, seed 3" in stream
    assert tiny_subject[0].dataset == "digits"  # the default data, as dyntta bench


def test_plot_only_redraws_from_the_file_without_computing(tmp_path, monkeypatch, capsys):
    def forbidden(args):
        raise AssertionError("--plot-only must not load data or models")

    monkeypatch.setattr(analysis_cli, "load_subject", forbidden)
    assert main(["analyze", "patch-shuffle", "--plot-only", "--out", str(tmp_path)]) == 2
    assert "run the analysis first" in capsys.readouterr().err
    rows = [{"analysis": "patch-shuffle", "model": "m", "dataset": "d", "stream": "s",
             "method": "source", "grid": n, "accuracy": 1.0 / n} for n in (1, 2, 4)]
    write_rows(tmp_path / "patch-shuffle.jsonl", rows)
    assert main(["analyze", "patch-shuffle", "--plot-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "patch-shuffle.png").stat().st_size > 0


def test_bad_options_are_rejected(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", "alpha-sweep", "--n-samples", "0"])
    assert exit_info.value.code == 2
    assert "positive integer or 'all'" in capsys.readouterr().err
    assert main(["analyze", "alpha-sweep", "--dataset", "mnist", "--out", str(tmp_path)]) == 2
    assert "unknown dataset 'mnist'" in capsys.readouterr().err
