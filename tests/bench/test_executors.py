"""Executors: submitit's local executor and the process pool give the serial run's records, a
failing cell is reported with its key (and log) while the others are recorded, a re-run runs only
what is missing, jobs check that they see the cache, and the [executor] grid table / CLI flags."""

from __future__ import annotations

import functools
import io
import os
import time
from pathlib import Path

import pytest

from dyntta.bench.config import ExecutorSpec, load_grid
from dyntta.bench.executors import CellsFailed, ProcessExecutor, SharedCheck, SlurmExecutor
from dyntta.bench.results import read_results
from dyntta.bench.runner import bind, run_grid
from dyntta.cli import main
from tests.bench.helpers import GRID_TOML, slow_on_seed_1, tiny_source

ROOT = Path(__file__).resolve().parents[2]
SMALL = GRID_TOML.replace("seeds = [0, 1]", "seeds = [0]").replace(
    '"source", "tbn", "dyn"', '"source", "dyn"').replace('"crossmix", "continual"', '"crossmix"')

FAILING = SMALL.replace('"source", "dyn"', '"dyn"').replace("n_domains = [3]", "n_domains = [3, 4]")
# one good cell and one failing cell (the tiny set has 3 corruptions, not 4)


def grid_file(tmp_path: Path, text: str = SMALL, name: str = "grid.toml"):
    path = tmp_path / name
    path.write_text(text)
    return load_grid(path)


def by_key(records: list[dict]) -> dict:
    return {r["key"]: (r["accuracy"], r["per_domain"], r["n_samples"]) for r in records}


@pytest.fixture
def importable_tests(monkeypatch):
    """Jobs are fresh Python processes: let them import tests.bench.helpers (the resolver)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT),
                                                                  os.environ.get("PYTHONPATH")])))


def local_jobs(tmp_path: Path, log=None) -> SlurmExecutor:
    return SlurmExecutor(ExecutorSpec(kind="slurm"), tmp_path / "jobs", tmp_path / "cache",
                         cluster="local", poll_s=0.2, log=log)


def test_submitit_jobs_give_the_serial_records_and_report_a_failing_cell(tmp_path,
                                                                         importable_tests):
    grid = grid_file(tmp_path, FAILING)
    bad = {c.key for c in grid.cells() if c.n_domains == 4}
    serial = run_grid(grid_file(tmp_path, FAILING.replace("[3, 4]", "[3]")),
                      tmp_path / "serial.jsonl", progress=False, resolver=tiny_source)
    assert len(serial) == len(bad) == 1
    results, log = tmp_path / "run.jsonl", io.StringIO()
    with pytest.raises(CellsFailed) as failed:
        run_grid(grid, results, progress=False, resolver=tiny_source,
                 executor=local_jobs(tmp_path, log))
    assert "submitted 2 cells" in log.getvalue()
    assert {f.key for f in failed.value.failures} == bad
    for f in failed.value.failures:
        assert "FileNotFoundError" in f.message and "defocus_blur" in f.message
        assert Path(f.log).is_file() and "defocus_blur" in Path(f.log).read_text()
        assert f.key in str(failed.value) and f.log in str(failed.value)
    assert by_key(read_results(results)) == by_key(serial)
    assert not list((tmp_path / "cache" / ".dyntta-jobs").iterdir())  # the marker is removed
    log = io.StringIO()
    with pytest.raises(CellsFailed):  # a re-run submits only the missing cells
        run_grid(grid, results, progress=False, resolver=tiny_source,
                 executor=local_jobs(tmp_path, log))
    assert "submitted 1 cells" in log.getvalue()
    assert len(read_results(results)) == 1


def test_process_pool_reports_a_failing_cell_and_records_the_others(tmp_path):
    grid = grid_file(tmp_path, FAILING)
    with pytest.raises(CellsFailed, match="1 cell\\(s\\) failed") as failed:
        run_grid(grid, tmp_path / "r.jsonl", workers=2, progress=False, resolver=tiny_source)
    assert {f.key for f in failed.value.failures} == {c.key for c in grid.cells()
                                                      if c.n_domains == 4}
    assert all(f.message.startswith("FileNotFoundError: tiny: no corruption 'defocus_blur'")
               for f in failed.value.failures)
    assert {r["key"] for r in read_results(tmp_path / "r.jsonl")} == {
        bind(c, tiny_source()).key for c in grid.cells() if c.n_domains == 3}


def test_an_interrupted_process_pool_stops_its_running_cells_at_once(tmp_path):
    """Ctrl-C in the driver (a KeyboardInterrupt where it waits for outcomes) stops the cells
    still running instead of waiting for them: the slow cell never reaches its end."""
    cells = grid_file(tmp_path, GRID_TOML).cells()
    fast, slow = (next(c for c in cells if c.seed == seed) for seed in (0, 1))
    outcomes = ProcessExecutor(2).map(functools.partial(slow_on_seed_1, tmp_path, 3.0),
                                      [fast, slow])
    assert next(outcomes) == (fast, {"key": fast.key})
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline, "the slow cell did not start"
        time.sleep(0.05)
    with pytest.raises(KeyboardInterrupt):
        outcomes.throw(KeyboardInterrupt)
    time.sleep(4.0)  # longer than the slow cell would still have taken
    assert not (tmp_path / "ended").exists()


def test_a_job_that_does_not_see_the_cache_folder_says_so(tmp_path):
    grid = grid_file(tmp_path)
    check = SharedCheck(lambda cell: {"key": cell.key}, tmp_path / "cache" / "marker")
    with pytest.raises(FileNotFoundError, match="cache folder .*cache is not visible on .*share$"):
        check(grid.cells()[0])
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "marker").touch()
    assert check(grid.cells()[0]) == {"key": grid.cells()[0].key}


def test_executor_table_and_flags(tmp_path, capsys):
    assert grid_file(tmp_path).executor == ExecutorSpec()
    grid = grid_file(tmp_path, SMALL + '[executor]\nkind = "slurm"\nslurm_partition = "gpu"\n'
                     "slurm_time = 30\n")
    assert grid.executor == ExecutorSpec("slurm", "gpu", 30)
    assert grid.cells() == grid_file(tmp_path).cells()  # where cells run is not part of them
    for bad, message in [('kind = "pbs"', "unknown kind 'pbs'; valid: process, slurm"),
                         ("slurm_time = 0", "slurm_time must be an int >= 1, got 0"),
                         ("gpus = 1", "unknown key\\(s\\) \\['gpus'\\]"),
                         ("slurm_partition = 3", "slurm_partition must be a string")]:
        with pytest.raises(ValueError, match=message):
            grid_file(tmp_path, SMALL + f"[executor]\n{bad}\n", "bad.toml")
    for flags, message in [(["--slurm-time", "0"], "slurm_time must be an int >= 1, got 0"),
                           (["--array-parallelism", "0"], "array_parallelism must be an int >= 1"),
                           (["--cpus-per-cell", "0"], "cpus_per_cell must be an int >= 1")]:
        assert main(["bench", "--config", str(tmp_path / "grid.toml"), "--executor", "slurm",
                     *flags]) == 2  # the flags reach the grid's [executor] table
        assert message in capsys.readouterr().err
