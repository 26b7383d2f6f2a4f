"""`dyntta bench --executor slurm` against a real Slurm cluster (`.ci/slurm-up` starts a one-node
one on this machine; `.ci/run` does so in CI): the same records as the serial run, a run killed
mid-way re-run submits only the missing cells, a failing job (an exception, a job lost before
it ran, the time limit) is reported with its cell and log, and the jobs of a driver killed with
SIGKILL are cancelled by the next run. Skips with the reason when no cluster answers, unless DYNTTA_REQUIRE_SLURM=1 (CI) makes it fail."""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dyntta.bench.config import ExecutorSpec, load_grid
from dyntta.bench.executors import Failure, SlurmExecutor
from dyntta.bench.results import read_results
from dyntta.bench.runner import bind
from dyntta.bench.sources import SourceOptions, resolve_source
from dyntta.cli import main
from dyntta.models import save_checkpoint
from tests.bench.helpers import (GRID_TOML, NPZ_GRID_TOML, sigint_as_in_a_terminal,
                                 to_the_time_limit)
from tests.conftest import tiny_resnet


def slurm_unavailable() -> str | None:
    """Why Slurm cannot be used here, or None when sbatch, sinfo and sacct answer."""
    for tool in ("sbatch", "sinfo", "sacct", "squeue"):
        if shutil.which(tool) is None:
            return f"{tool} not found (no Slurm client; .ci/slurm-up starts a one-node cluster)"
    for command in (["sinfo", "-h"], ["sacct", "-n", "-X"]):
        try:
            subprocess.run(command, capture_output=True, timeout=20, check=True)
        except (subprocess.SubprocessError, OSError) as exc:
            return f"the Slurm cluster does not answer {' '.join(command)}: {exc}"
    return None


@pytest.fixture(scope="module")
def cluster_data(tmp_path_factory):
    """A tiny npz test set, its model and a grid file; the corrupted set built once."""
    reason = slurm_unavailable()
    if reason:
        if os.environ.get("DYNTTA_REQUIRE_SLURM") == "1":
            pytest.fail(f"DYNTTA_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    d = tmp_path_factory.mktemp("slurm")
    rng = np.random.default_rng(0)
    np.savez(d / "clean.npz", x=rng.integers(0, 256, (16, 32, 32, 3), dtype=np.uint8),
             y=rng.integers(0, 3, 16))
    save_checkpoint(tiny_resnet(), d / "tiny.pt", classes=["a", "b", "c"])
    (d / "grid.toml").write_text(NPZ_GRID_TOML)
    return d


def test_a_cell_past_its_time_limit_is_reported_as_such(cluster_data, tmp_path, monkeypatch):
    """A 1-minute limit: submitit asks for the warning signal 30 s before the end (Slurm may send
    it up to a minute early). The cell that would sleep 10 minutes (submitit handles the signal,
    or, where it came before submitit's handler, dies of it) and the one the signal kills are both
    reported as timed out (that the other cells of a run finish: the failed-and-cancelled test)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(  # jobs import tests.bench.helpers
        filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])))
    (tmp_path / "grid.toml").write_text(GRID_TOML)
    cells = load_grid(tmp_path / "grid.toml").cells()
    slow, unready = (next(c for c in cells if (c.seed, c.scenario) == (seed, scenario))
                     for seed, scenario in ((1, "crossmix"), (0, "continual")))
    executor = SlurmExecutor(ExecutorSpec("slurm", slurm_time=1), tmp_path / "jobs",
                             tmp_path / "cache", poll_s=0.5, log=None)
    outcomes = dict(executor.map(functools.partial(to_the_time_limit, tmp_path), [slow, unready]))
    for cell, log_says in ((slow, ("timed-out", "User defined signal 2")),
                           (unready, ("User defined signal 2",))):
        failure = outcomes[cell]
        assert isinstance(failure, Failure) and failure.key == cell.key, failure
        assert re.fullmatch(r"job \d+_\d: reached its time limit of 1 min \(give more with "
                            r"--slurm-time\)", failure.message), failure.message
        log = Path(failure.log).read_text()
        assert any(text in log for text in log_says), log
    assert not (tmp_path / "ended").exists()


def test_the_jobs_of_a_killed_driver_are_cancelled_by_the_next_run(cluster_data):
    """SIGKILL leaves the driver no chance to cancel its jobs; the next run of the same command
    cancels that array before it submits the missing cells, and ends with the serial records."""
    d = cluster_data
    if not (d / "serial" / "results.jsonl").is_file():
        assert main(bench_args(d, "serial")) == 0
    run = start_bench(d, "killed", "--executor", "slurm", "--array-parallelism", "1")
    array = re.search(r"submitted 3 cells as Slurm job array (\d+)", run.stderr.readline()).group(1)
    run.kill()
    run.communicate(timeout=60)
    assert "PENDING" in subprocess.run(["squeue", "-h", "-j", array, "-o", "%T"],
                                       capture_output=True, text=True).stdout
    rerun = start_bench(d, "killed", "--executor", "slurm")
    err = rerun.communicate(timeout=600)[1]
    assert rerun.returncode == 0, err
    assert f"cancelled Slurm job array {array}, left by a driver that was killed" in err
    queue = subprocess.run(["squeue", "-h", "-j", array, "-o", "%T"], capture_output=True,
                           text=True).stdout
    assert "RUNNING" not in queue and "PENDING" not in queue, queue
    assert by_key(read_results(d / "killed" / "results.jsonl")) == by_key(
        read_results(d / "serial" / "results.jsonl"))


def bench_args(d: Path, out: str, *extra: str) -> list[str]:
    return ["bench", "--config", str(d / "grid.toml"), "--data-dir", str(d), "--cache-dir",
            str(d / "cache"), "--out", str(d / out), "--no-progress", *extra]


def start_bench(d: Path, out: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[2] / "src"),
                      os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "dyntta.cli", *bench_args(d, out, *extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=sigint_as_in_a_terminal)


def by_key(records: list[dict]) -> dict:
    return {r["key"]: (r["accuracy"], r["per_domain"], r["n_samples"]) for r in records}


def test_slurm_run_killed_midway_resumes_with_only_the_missing_cells(cluster_data):
    d = cluster_data
    assert main(bench_args(d, "serial")) == 0
    serial = read_results(d / "serial" / "results.jsonl")
    results = d / "slurm" / "results.jsonl"
    run = start_bench(d, "slurm", "--executor", "slurm", "--array-parallelism", "1")
    deadline = time.monotonic() + 300
    while not (results.exists() and results.read_text().count("\n") >= 1):
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, "no record within 300 s"
        time.sleep(0.5)
    run.send_signal(signal.SIGINT)  # killed mid-way: one job at a time, one record so far
    err = run.communicate(timeout=120)[1]
    assert run.returncode != 0, err
    array = re.search(r"submitted 3 cells as Slurm job array (\d+)", err).group(1)
    kept = read_results(results)
    assert 1 <= len(kept) < 3, err
    time.sleep(2)  # the jobs it left were cancelled, not left running
    queue = subprocess.run(["squeue", "-h", "-j", array, "-o", "%i %T"], capture_output=True,
                           text=True).stdout
    assert "RUNNING" not in queue and "PENDING" not in queue, queue
    rerun = start_bench(d, "slurm", "--executor", "slurm")
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    assert f"submitted {3 - len(kept)} cells" in err
    records = read_results(results)
    assert len(records) == 3 and by_key(records) == by_key(serial)
    assert records[:len(kept)] == kept  # the records of the killed run stay as they were


def test_failed_and_cancelled_jobs_are_reported_and_the_other_cells_finish(cluster_data):
    d = cluster_data
    run = start_bench(d, "failing", "--executor", "slurm", "--methods", "tbn", "dyn",
                      "--set", "stream.n_domains=[3, 16]", "--array-parallelism", "1")
    first = run.stderr.readline()  # cells: tbn 3, dyn 3, tbn 16, dyn 16 (n_domains > 15 fails)
    array = re.search(r"submitted 4 cells as Slurm job array (\d+)", first).group(1)
    subprocess.run(["scancel", f"{array}_1"], check=True)  # lost before it ran, like a dead node
    err = run.communicate(timeout=600)[1]
    assert run.returncode == 1, err
    grid = load_grid(d / "grid.toml", ["stream.n_domains=[3, 16]", 'methods=["tbn", "dyn"]'])
    source = resolve_source(grid.datasets[0], SourceOptions(str(d), str(d / "cache"),
                                                            severities=(grid.severity,)))
    cells = [bind(c, source) for c in grid.cells()[:2]] + grid.cells()[2:]  # 16 domains: unplanned
    assert "3 cell(s) failed" in err
    lost = next(line for line in err.splitlines() if cells[1].key in line)
    assert lost.endswith(f"job {array}_1: ended without a result (no longer known to Slurm)")
    for cell in cells[2:]:
        line = next(line for line in err.splitlines() if cell.key in line)
        assert "ValueError: n_domains must be in 1..15, got 16" in line, line
        assert re.search(r"\(log: \S+/slurm/\d+_\d/\d+_\d_0_log.err\)$", line), line
    log = Path(re.search(r"\(log: (\S+)\)$", line).group(1))
    assert "n_domains must be in 1..15" in log.read_text()
    records = read_results(d / "failing" / "results.jsonl")
    assert [r["key"] for r in records] == [cells[0].key]
