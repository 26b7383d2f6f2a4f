"""Bad input and faults through the real ``dyntta`` command (a subprocess each): every one ends
with one clear error line naming the problem, a non-zero exit status and no Python traceback."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dyntta.cli import main
from dyntta.models import save_checkpoint
from tests.bench.helpers import NPZ_GRID_TOML, sigint_as_in_a_terminal
from tests.conftest import tiny_resnet

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = os.geteuid() == 0  # root ignores file permissions: chmod cannot make a folder unwritable
BENCH = ["bench", "--config", "grid.toml", "--no-progress", "--methods", "source"]


def dyntta(*args: str, cwd: Path, **popen) -> subprocess.Popen:
    """Start ``dyntta ARGS`` (this tree's package) in ``cwd``; output captured as text."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "DYNTTA_CACHE": str(cwd / "default-cache")}
    return subprocess.Popen([sys.executable, "-m", "dyntta.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def write_inputs(d: Path) -> None:
    """A tiny labelled set (3 classes), its 3-class checkpoint, damaged variants of both, a
    regular file ``afile`` to put paths under and a folder ``ro`` without write permission."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (24, 32, 32, 3), dtype=np.uint8)
    np.savez(d / "clean.npz", x=x, y=rng.integers(0, 3, 24))
    np.savez(d / "big.npz", x=x, y=np.full(24, 99))
    np.savez(d / "neg.npz", x=x, y=np.full(24, -1))
    save_checkpoint(tiny_resnet(), d / "tiny.pt", classes=["a", "b", "c"])
    for name, value in (("nan.pt", float("nan")), ("negvar.pt", -1.0)):
        model = tiny_resnet()
        model.net.bn1.running_var[0] = value
        save_checkpoint(model, d / name)
    (d / "text.pt").write_text("hello\n")
    (d / "afile").write_text("a regular file\n")
    (d / "grid.toml").write_text(NPZ_GRID_TOML)
    (d / "noconfig.jsonl").write_text('{"key": "x", "accuracy": 0.5}\n')
    (d / "ro").mkdir()
    (d / "ro").chmod(0o500)


CASES = {
    # name: (arguments, words the error line must hold)
    "seeds-negative": (["bench", "--seeds", "-1"], "argument --seeds: expected an integer >= 0"),
    "workers-zero": (["bench", "--workers", "0"], "argument --workers: expected an integer >= 1"),
    "device-unknown": (["bench", "--device", "nope"], "argument --device: unknown device 'nope'"),
    "device-cuda-missing": (["bench", "--device", "cuda"], "CUDA is not available here"),
    "analyze-device": (["analyze", "alpha-sweep", "--device", "nope"], "argument --device"),
    "bench-out-under-a-file": ([*BENCH, "--out", "afile/run"],
                               "afile/run: a part of this path is a file, not a folder"),
    "bench-out-not-permitted": ([*BENCH, "--out", "/sys/dyntta-run"], "/sys/dyntta-run: "),
    "bench-out-read-only": ([*BENCH, "--out", "ro/run"], "ro/run: no permission"),
    "bench-cache-under-a-file": ([*BENCH, "--out", "o1", "--cache-dir", "afile/cache"],
                                 "afile/cache/built/clean-C-"),
    "option-type": ([*BENCH, "--out", "o2", "--methods", "dyn", "--set",
                     'options.dyn.alpha="0.5"'],
                    "option 'alpha' of DYNConfig must be a number, got '0.5' (str)"),
    "labels-beyond-classes": ([*BENCH, "--out", "o3", "--cache-dir", "c3", "--dataset", "npz",
                               "--dataset-path", "big.npz", "--checkpoint", "tiny.pt"],
                              "big.npz: labels go up to 99 but the model has 3 classes (0..2)"),
    "labels-negative": ([*BENCH, "--out", "o4", "--cache-dir", "c4", "--dataset", "npz",
                         "--dataset-path", "neg.npz", "--checkpoint", "tiny.pt"],
                        "neg.npz: labels must be >= 0"),
    "checkpoint-nan": ([*BENCH, "--out", "o5", "--checkpoint", "nan.pt"],
                       "nan.pt: tensor 'bn1.running_var' holds 1 NaN/Inf value"),
    "checkpoint-negative-variance": ([*BENCH, "--out", "o6", "--checkpoint", "negvar.pt"],
                                     "tensor 'bn1.running_var' holds a negative variance (-1)"),
    "checkpoint-unreadable": ([*BENCH, "--out", "o7", "--checkpoint", "text.pt"],
                              "not a file written by torch.save"),
    "train-epochs-zero": (["train", "--epochs", "0", "--out", "m.pt"],
                          "argument --epochs: expected an integer >= 1, got '0'"),
    "train-out-under-a-file": (["train", "--out", "afile/m.pt"], "afile: a file is in the way"),
    "train-out-is-a-folder": (["train", "--out", "ro"], "ro: this is a folder; give a file name"),
    "train-negative-labels": (["train", "--npz", "neg.npz", "--out", "m.pt"],
                              "training labels: labels must be >= 0"),
    "make-c-out-under-a-file": (["make-c", "clean.npz", "afile/c", "--no-progress"],
                                "afile/c: a part of this path is a file"),
    "make-c-negative-labels": (["make-c", "neg.npz", "negc", "--no-progress"],
                               "labels: labels must be >= 0"),
    "make-c-seed": (["make-c", "clean.npz", "c", "--seed", "-1"], "argument --seed"),
    "report-out-under-a-file": (["report", "run/results.jsonl", "--out", "afile/rep"],
                                "afile/rep: a part of this path is a file"),
    "report-record-without-config": (["report", "noconfig.jsonl"],
                                     "record 1 has no 'config'"),
    "checkpoint-missing-default-grid": (["bench", "--checkpoint", "nope.th", "--out", "o8",
                                         "--no-progress"], "checkpoint not found: nope.th"),
    "download-unknown-set": (["download", "nope-c", "data"], "argument dataset: invalid choice"),
    "analyze-out-under-a-file": (["analyze", "alpha-sweep", "--out", "afile/an"],
                                 "afile/an: a part of this path is a file"),
}
SKIPS = {
    "device-cuda-missing": (torch.cuda.is_available(), "CUDA is available here"),
    "bench-out-read-only": (ROOT, "root ignores file permissions"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[int, str, Path]]:
    """Every case run once, two at a time: name -> (exit status, stderr, folder)."""
    d = tmp_path_factory.mktemp("bad")
    write_inputs(d)  # and a finished run for report
    bench = [*BENCH[:2], str(d / "grid.toml"), *BENCH[3:]]
    assert main([*bench, "--out", str(d / "run"), "--data-dir", str(d),
                 "--cache-dir", str(d / "cache")]) == 0

    def run(name):
        proc = dyntta(*CASES[name][0], cwd=d)
        _, err = proc.communicate(timeout=300)
        return name, (proc.returncode, err, d)

    todo = [name for name in CASES if not SKIPS.get(name, (False,))[0]]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(pool.map(run, todo))


def assert_one_error_line(code: int, err: str, command: str, words: str) -> None:
    """Exit status 2 and stderr = (argparse's usage lines and) one line naming the problem."""
    assert "Traceback" not in err, err
    assert code == 2, err
    *usage, last = err.strip().splitlines()
    assert last.startswith(f"dyntta {command}") and "error: " in last, err
    assert all(line.startswith(("usage:", " ")) for line in usage), err
    assert words in last, err


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.skipif(SKIPS[n][0], reason=SKIPS[n][1])) if n in SKIPS
    else n for n in CASES])
def test_bad_input_is_one_error_line_without_traceback(outcomes, name):
    code, err, d = outcomes[name]
    args, words = CASES[name]
    assert_one_error_line(code, err, args[0], words)


def test_bad_labels_are_refused_before_anything_is_built(outcomes):
    d = outcomes["labels-negative"][2]
    assert not (d / "c3").exists() and not (d / "c4").exists()  # no corrupted set in the caches
    assert not (d / "negc").exists()  # make-c: no output folder
    assert not (d / "m.pt").exists()  # train --epochs 0 / negative labels: no checkpoint


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_during_bench_keeps_the_results_and_says_how_to_resume(tmp_path, workers):
    """SIGINT to the process group (what Ctrl-C in a terminal sends) after the first record:
    one line naming the results file and how to resume (with worker processes too, which stop
    with the driver); the same command then finishes the grid, keeping the records written
    before the interruption."""
    write_inputs(tmp_path)
    args = [*BENCH, "--out", "big", "--methods", "source", "tbn", "--seeds", *map(str, range(20)),
            "--workers", workers]
    proc = dyntta(*args, cwd=tmp_path, start_new_session=True,
                  preexec_fn=sigint_as_in_a_terminal)
    results = tmp_path / "big" / "results.jsonl"
    deadline = time.monotonic() + 240
    while not (results.is_file() and results.read_text().count("\n") >= 1):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"dyntta bench: interrupted; the finished cells are kept in {Path('big/results.jsonl')}; "
        "run the same command again to resume")
    before = [json.loads(line) for line in results.read_text().splitlines()]
    assert 1 <= len(before) < 40, "the interrupt came after the grid finished"
    resumed = dyntta(*args, cwd=tmp_path)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    after = [json.loads(line) for line in results.read_text().splitlines()]
    assert after[: len(before)] == before
    assert len({r["key"] for r in after}) == len(after) == 40


def test_a_torn_line_in_the_middle_of_results_is_skipped_with_a_warning(outcomes):
    """A crash mid-append leaves a torn line that later appends bury in the middle: `report`
    skips it with a one-line warning naming it, and `bench` re-runs its cell."""
    d = outcomes["labels-negative"][2]
    whole = (d / "run" / "results.jsonl").read_text()
    (d / "torn").mkdir()
    (d / "torn" / "results.jsonl").write_text('{"key": "cut sh\n' + whole)
    report = dyntta("report", "torn/results.jsonl", cwd=d)
    out, err = report.communicate(timeout=300)
    assert report.returncode == 0 and "Traceback" not in err, err
    assert err.startswith("dyntta report: warning: torn/results.jsonl: line 1 is not a whole "
                          "JSON record; skipped"), err
    assert "| source |" in out
    assert len(err.strip().splitlines()) == 1, err
    (d / "torn" / "results.jsonl").write_text('{"key": "cut sh\n')
    bench = dyntta(*BENCH, "--out", "torn", "--cache-dir", "cache", cwd=d)
    _, err = bench.communicate(timeout=300)
    assert bench.returncode == 0 and "Traceback" not in err, err
    rerun = json.loads((d / "torn" / "results.jsonl").read_text().splitlines()[-1])
    first = json.loads(whole)
    assert (rerun["key"], rerun["batch_correct"]) == (first["key"], first["batch_correct"])


def test_a_warm_make_c_prints_no_empty_progress_bar(tmp_path):
    write_inputs(tmp_path)
    args = ("make-c", "clean.npz", "c", "--severities", "5", "--corruptions", "fog")
    errs = []
    for _ in range(2):
        proc = dyntta(*args, cwd=tmp_path)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        errs.append(err)
    assert "make-c" in errs[0] and "chunk" in errs[0]  # the cold build shows its bar
    assert "chunk" not in errs[1] and "Traceback" not in errs[1], errs[1]
