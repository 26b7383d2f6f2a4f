"""A cell's key covers what it was computed from (configuration, model, data, test rows): a
re-run into the same run folder with another checkpoint, or with the data file replaced at the
same path, runs its cells anew and prints their table, never the old one."""

from __future__ import annotations

import numpy as np
import pytest

from dyntta.bench.config import load_grid
from dyntta.bench.report import table
from dyntta.bench.results import read_results
from dyntta.bench.runner import bind, run_cell
from dyntta.bench.sources import Source
from dyntta.cli import main
from dyntta.models import save_checkpoint
from tests.bench.helpers import GRID_TOML, tiny_source
from tests.bench.test_own_model import folder  # noqa: F401 (a fixture)
from tests.conftest import tiny_resnet


def printed_table(stdout: str) -> str:
    """The table ``dyntta bench`` printed (between its title and the closing line)."""
    return stdout.split("\n\n", 1)[1].rsplit("\nresults and report in", 1)[0].strip()


def test_another_checkpoint_or_a_replaced_data_file_runs_anew(folder, capsys):  # noqa: F811
    def bench(checkpoint: str) -> str:
        """``dyntta bench`` in this process (the command's code path); what it printed."""
        assert main(["bench", "--config", "grid.toml", "--no-progress", "--cache-dir", "cache",
                     "--methods", "source", "tbn", "--out", "run", "--checkpoint", checkpoint]) == 0
        return capsys.readouterr().out

    results = folder / "run" / "results.jsonl"
    bench("tiny.pt")
    save_checkpoint(tiny_resnet(seed=1), folder / "other.pt", classes=["a", "b", "c"])
    other = bench("other.pt")
    records = read_results(results)
    shas = [r["checkpoint_sha256"] for r in records]
    assert len(records) == 4 and len(set(shas)) == 2  # two records of each cell
    new = [r for r in records if r["checkpoint_sha256"] == shas[-1]]
    assert printed_table(other) == table(new)[0].strip()

    rng = np.random.default_rng(1)  # other images, the same labels, at the same path
    with np.load(folder / "clean.npz") as data:
        labels = data["y"]
    np.savez(folder / "clean.npz", x=rng.integers(0, 256, (24, 32, 32, 3), dtype=np.uint8),
             y=labels)
    replaced = bench("other.pt")
    records = read_results(results)
    assert len(records) == 6 and len({r["config"]["source"]["data_sha256"] for r in records}) == 2
    assert printed_table(replaced) == table(records[4:])[0].strip()

    again = bench("other.pt")  # nothing changed: resumed
    assert len(read_results(results)) == 6
    assert printed_table(again) == printed_table(replaced)


def test_a_cell_planned_for_one_model_refuses_another(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID_TOML)
    cell = load_grid(path).cells()[0]
    source = tiny_source()
    bound = bind(cell, source)
    assert bound.key != cell.key and bound.rows is not None
    assert run_cell(bound, source)["key"] == bound.key
    other = Source(source.name, source.dataset, tiny_resnet(seed=1), source.model_name,
                   source.checkpoint_sha256)
    assert dict(bind(cell, other).source)["weights_sha256"] != dict(bound.source)["weights_sha256"]
    with pytest.raises(ValueError, match="the model or test data here differ from those the run "
                                         "was planned with"):
        run_cell(bound, other)
