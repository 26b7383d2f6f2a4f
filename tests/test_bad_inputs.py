"""Bad input and faults through the ``dyntta`` command: every one ends with one clear error line
naming the problem, a non-zero exit status and no Python traceback. Each case runs through
``dyntta.cli.main`` in this process (what the ``dyntta`` script calls; an exception it lets
through fails the test); one case per sub-command also runs as a real subprocess."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
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


def dyntta_here(args: list[str], cwd: Path, out: io.StringIO | None = None) -> tuple[int, str]:
    """``dyntta ARGS`` run through ``main`` in this process, in ``cwd`` with the cache that
    :func:`dyntta` gives: (exit status, stderr); stdout goes to ``out`` if given."""
    err = io.StringIO()
    env = {"DYNTTA_CACHE": str(cwd / "default-cache")}
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(out or io.StringIO()):
        patch.chdir(cwd)
        for name, value in env.items():
            patch.setenv(name, value)
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's errors
            code = exc.code
    return code, err.getvalue()


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
    write_more_inputs(d)


GRIDS = {  # grid files that are read as something else, or whose error misled
    "severity-fraction": NPZ_GRID_TOML.replace("n_domains", "severity = 4.9\nn_domains"),
    "severity-list": NPZ_GRID_TOML.replace("n_domains", "severity = [3, 5]\nn_domains"),
    "seed-fraction": "seeds = [1.7]\n" + NPZ_GRID_TOML,
    "seeds-empty": "seeds = []\n" + NPZ_GRID_TOML,
    "methods-empty": NPZ_GRID_TOML.replace('methods = ["source", "tbn", "dyn"]', "methods = []"),
    "methods-repeated": NPZ_GRID_TOML.replace('"tbn", "dyn"', '"dyn", "dyn"'),
    "scenarios-empty": NPZ_GRID_TOML.replace('scenarios = ["crossmix"]', "scenarios = []"),
    "datasets-table": NPZ_GRID_TOML.replace("[[datasets]]", "[datasets]"),
    "datasets-repeated": NPZ_GRID_TOML + NPZ_GRID_TOML[NPZ_GRID_TOML.index("[[datasets]]"):],
    "delta-text": NPZ_GRID_TOML.replace("n_domains", 'deltas = ["abc"]\nn_domains'),
    "digits-path": NPZ_GRID_TOML.replace('name = "npz"', 'name = "digits"'),
    "compile-backend": "compile = { backend = \"nope\" }\n" + NPZ_GRID_TOML,
    "compile-keyword": "compile = { speed = true }\n" + NPZ_GRID_TOML,
    "compile-mode": "compile = { mode = \"fastest\" }\n" + NPZ_GRID_TOML,
}


def result_line(**changes) -> str:
    """A results line as dyntta bench writes it (two batches of 10), with ``changes``."""
    record = {"key": "k", "accuracy": 0.5, "batch_correct": [5, 5], "batch_n": [10, 10],
              "per_domain": {"fog": 0.5}, "n_samples": 20,
              "config": {"dataset": {"name": "digits"}, "scenario": "crossmix", "method": "dyn",
                         "batch_size": 10, "n_domains": 1, "rounds": 1, "delta": None,
                         "severity": 5, "seed": 0, "options": {}}}
    for key, value in sorted(changes.items(), key=lambda item: "__" not in item[0]):
        where, _, field = key.partition("__")  # config__x: a field of the config, first
        (record["config"] if field else record)[field or where] = value
    return json.dumps(record) + "\n"


RESULTS = {  # results files that are impossible or not results at all
    "accuracy-above-one": result_line(accuracy=4.0),
    "accuracy-nan": result_line(accuracy=float("nan")),
    "accuracy-text": result_line(accuracy="high"),
    "config-empty": result_line(config={}),
    "config-list": result_line(config=[1, 2]),
    "dataset-text": result_line(config__dataset="digits"),
    "method-number": result_line(config__method=3),
    "hits-beyond-sizes": result_line(batch_correct=[50, 5]),
}


def write_more_inputs(d: Path) -> None:
    """Grids, results files, damaged archives and checkpoints of the second round of bad input."""
    for name, text in GRIDS.items():
        (d / f"{name}.toml").write_bytes(text.encode())
    (d / "latin1.toml").write_bytes(NPZ_GRID_TOML.replace("tiny npz", "d\xe9j\xe0").encode("latin-1"))
    for name, text in RESULTS.items():
        (d / f"{name}.jsonl").write_text(text)
    (d / "binary.jsonl").write_bytes(bytes(range(256)) * 64)
    (d / "table.jsonl").write_text("a,b,c\n" + "1,2,3\n" * 500)
    data = (d / "clean.npz").read_bytes()
    (d / "truncated.npz").write_bytes(data[: len(data) // 2])
    np.save(d / "plain.npy", np.zeros((2, 32, 32, 3), np.uint8))
    (d / "plain.npz").write_bytes((d / "plain.npy").read_bytes())
    (d / "text.npz").write_text("x,y\n1,2\n")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 24)
    y[5] = 1_000_000
    np.savez(d / "stray.npz", x=rng.integers(0, 256, (24, 32, 32, 3), dtype=np.uint8), y=y)
    np.savez(d / "more-labels.npz", x=rng.integers(0, 256, (10, 8, 8, 3), dtype=np.uint8),
             y=rng.integers(0, 3, 14))
    save_checkpoint(tiny_resnet(num_classes=100), d / "tiny100.pt")
    save_checkpoint(tiny_resnet(num_classes=10), d / "tiny10.pt")
    state = tiny_resnet().net.state_dict()
    torch.save({0: state["conv1.weight"], **state}, d / "intkeys.pt")
    torch.save({k.replace("layer2.0.", "layer2.1."): v for k, v in state.items()},
               d / "noblock0.pt")
    blob = torch.load(d / "tiny.pt", weights_only=True)
    torch.save({k: v for k, v in blob.items() if k != "mean"}, d / "nomean.pt")
    torch.save({**blob, "mean": [0.5], "std": [0.25]}, d / "onemean.pt")
    (d / "empty-c").mkdir()


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
                                     "noconfig.jsonl: line 1: config must be a non-empty object"),
    "checkpoint-missing-default-grid": (["bench", "--checkpoint", "nope.th", "--out", "o8",
                                         "--no-progress"], "checkpoint not found: nope.th"),
    "download-unknown-set": (["download", "nope-c", "data"], "argument dataset: invalid choice"),
    "analyze-out-under-a-file": (["analyze", "alpha-sweep", "--out", "afile/an"],
                                 "afile/an: a part of this path is a file"),
    # read as something else
    "severity-fraction": ([*BENCH[:2], "severity-fraction.toml", *BENCH[3:]],
                          "severity-fraction.toml: stream.severity must be one integer in 1..5"),
    "severity-list": ([*BENCH[:2], "severity-list.toml", *BENCH[3:]],
                      "severity-list.toml: stream.severity must be one integer in 1..5"),
    "seed-fraction": ([*BENCH[:2], "seed-fraction.toml", "--no-progress"],
                      "seed-fraction.toml: seeds must be a non-empty list of integers >= 0, "
                      "got [1.7]"),
    "dataset-path-without-dataset": ([*BENCH, "--dataset-path", "clean.npz"],
                                     "--dataset-path needs --dataset"),
    "digits-path": (["bench", "--dataset", "digits", "--dataset-path", "clean.npz"],
                    "'digits' is embedded and takes no path"),
    "digits-path-in-grid": ([*BENCH[:2], "digits-path.toml", *BENCH[3:]],
                            "digits-path.toml: datasets[0]: 'digits' is embedded"),
    "analyze-digits-path": (["analyze", "alpha-sweep", "--dataset-path", "clean.npz"],
                            "'digits' is embedded and takes no path"),
    # models and data that do not fit
    "checkpoint-classes": (["bench", "--checkpoint", "tiny100.pt", "--out", "o9", "--no-progress"],
                           "tiny100.pt: the model predicts 100 classes but digits has 10"),
    "train-stray-label": (["train", "--npz", "stray.npz", "--out", "m.pt"],
                          "training labels go up to 1000000 but 999997 of the classes"),
    # impossible records, and files that are not results
    **{f"report-{name}": (["report", f"{name}.jsonl"], f"{name}.jsonl: line 1: {words}")
       for name, words in (("accuracy-above-one", "accuracy must be a number in [0, 1]"),
                           ("accuracy-nan", "accuracy must be a number in [0, 1]"),
                           ("accuracy-text", "accuracy must be a number in [0, 1]"),
                           ("config-empty", "config must be a non-empty object"),
                           ("config-list", "config must be a non-empty object"),
                           ("dataset-text", "config.dataset must be an object"),
                           ("method-number", "config.method must be a string"),
                           ("hits-beyond-sizes", "batch_correct must lie within"))},
    "report-binary": (["report", "binary.jsonl"], "binary.jsonl: not a results file (binary"),
    "report-csv": (["report", "table.jsonl"], "table.jsonl: not a results file: none of its "
                   "501 line(s)"),
    "report-columns": (["report", "run/results.jsonl", "--columns", "bogus"],
                       "argument --columns: invalid choice: 'bogus'"),
    # tracebacks that reached the user
    "make-c-truncated-npz": (["make-c", "truncated.npz", "t1"], "truncated.npz: a damaged or "
                             "truncated .npz archive"),
    "make-c-npy-as-npz": (["make-c", "plain.npz", "t2"], "plain.npz: a single .npy array, "
                          "not an .npz archive"),
    "make-c-text-as-npz": (["make-c", "text.npz", "t3"], "text.npz: not an .npz archive (no "
                           "zip header"),
    # labels that silently paired with other images
    "refresh-check-more-labels": (["refresh", "more-labels.npz", "--checkpoint", "tiny.pt",
                                   "--check"], "more-labels.npz: 10 images (x) but 14 labels (y)"),
    "checkpoint-int-keys": ([*BENCH, "--out", "o10", "--checkpoint", "intkeys.pt"],
                            "intkeys.pt: state dict keys must be parameter names, got 0"),
    "checkpoint-no-block-0": ([*BENCH, "--out", "o11", "--checkpoint", "noblock0.pt"],
                              "noblock0.pt: cannot infer the architecture: stage layer2 has "
                              "blocks [1]"),
    "checkpoint-no-mean": ([*BENCH, "--out", "o12", "--checkpoint", "nomean.pt"],
                           "nomean.pt: a dyntta checkpoint without its input normalisation"),
    "checkpoint-one-mean": ([*BENCH, "--out", "o13", "--checkpoint", "onemean.pt"],
                            "onemean.pt: mean and std have 1 value(s) but the network takes 3 "
                            "input channels"),
    "compile-backend": ([*BENCH[:2], "compile-backend.toml", *BENCH[3:]],
                        "compile-backend.toml: compile: unknown backend 'nope'"),
    "compile-keyword": ([*BENCH[:2], "compile-keyword.toml", *BENCH[3:]],
                        "compile-keyword.toml: compile: unknown key(s) ['speed']"),
    "compile-mode": ([*BENCH[:2], "compile-mode.toml", *BENCH[3:]],
                     "compile-mode.toml: compile: unknown mode 'fastest'"),
    "executor-slurm-missing": ([*BENCH, "--out", "o14", "--executor", "slurm"],
                               "sbatch is not on the PATH"),
    # errors that misled
    "datasets-table": ([*BENCH[:2], "datasets-table.toml", *BENCH[3:]],
                       "datasets-table.toml: datasets must be an array of tables: write "
                       "[[datasets]]"),
    "methods-empty": ([*BENCH[:2], "methods-empty.toml", "--no-progress"],
                      "methods-empty.toml: methods must be a non-empty list of names, got []"),
    "scenarios-empty": ([*BENCH[:2], "scenarios-empty.toml", *BENCH[3:]],
                        "scenarios-empty.toml: stream.scenarios must be a non-empty list"),
    "seeds-empty": ([*BENCH[:2], "seeds-empty.toml", *BENCH[3:]],
                    "seeds-empty.toml: seeds must be a non-empty list of integers"),
    "methods-repeated": ([*BENCH[:2], "methods-repeated.toml", "--no-progress"],
                         "methods-repeated.toml: methods lists dyn more than once"),
    "methods-repeated-flag": ([*BENCH, "--methods", "tbn", "tbn"], "methods lists tbn more "
                              "than once"),
    "datasets-repeated": ([*BENCH[:2], "datasets-repeated.toml", *BENCH[3:]],
                          "datasets-repeated.toml: datasets[1]: repeats datasets[0]"),
    "delta-text": ([*BENCH[:2], "delta-text.toml", *BENCH[3:]],
                   "delta-text.toml: stream.deltas must be a non-empty list of numbers > 0, "
                   "got ['abc']"),
    "option-key-named": ([*BENCH, "--set", "options.dyn.alpha=abc", "--methods", "dyn"],
                         "option 'alpha' of DYNConfig must be a number, got 'abc'"),
    "grid-not-utf8": ([*BENCH[:2], "latin1.toml", *BENCH[3:]],
                      "latin1.toml: not a UTF-8 text file"),
    "download-onto-a-file": (["download", "cifar10-c", "afile"],
                             "afile is a file, not a folder"),
    "cifar10-c-empty-folder": (["bench", "--dataset", "cifar10-c", "--dataset-path", "empty-c",
                                "--checkpoint", "tiny10.pt", "--out", "o15", "--no-progress"],
                               "cifar10-c: empty-c holds no labels.npy (expected "
                               "<corruption>.npy and labels.npy"),
}
SKIPS = {
    "device-cuda-missing": (torch.cuda.is_available(), "CUDA is available here"),
    "bench-out-read-only": (ROOT, "root ignores file permissions"),
    "executor-slurm-missing": (shutil.which("sbatch") is not None, "Slurm is installed here"),
}


SUBPROCESS = ("option-type", "report-binary", "make-c-truncated-npz", "train-stray-label",
              "analyze-digits-path", "download-onto-a-file", "workers-zero")
"""One case per sub-command (and one of argparse's), also run as a real ``dyntta`` process."""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[int, str, Path]]:
    """Every case run once: name -> (exit status, stderr, folder)."""
    d = tmp_path_factory.mktemp("bad")
    write_inputs(d)  # and a finished run for report
    bench = [*BENCH[:2], str(d / "grid.toml"), *BENCH[3:]]
    assert main([*bench, "--out", str(d / "run"), "--data-dir", str(d),
                 "--cache-dir", str(d / "cache")]) == 0
    todo = [name for name in CASES if not SKIPS.get(name, (False,))[0]]
    return {name: (*dyntta_here(CASES[name][0], d), d) for name in todo}


def assert_one_error_line(code: int, err: str, command: str, words: str) -> None:
    """Exit status 2 and stderr = one line naming the problem."""
    assert "Traceback" not in err, err
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"dyntta {command}") and "error: " in line, err
    assert words in line, err


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.skipif(SKIPS[n][0], reason=SKIPS[n][1])) if n in SKIPS
    else n for n in CASES])
def test_bad_input_is_one_error_line_without_traceback(outcomes, name):
    code, err, d = outcomes[name]
    args, words = CASES[name]
    assert_one_error_line(code, err, args[0], words)


@pytest.mark.parametrize("name", SUBPROCESS)
def test_the_real_command_prints_the_same_error_line(outcomes, name):
    """The ``dyntta`` process (``python -m dyntta.cli``) ends as ``main`` does in this process."""
    code, err, d = outcomes[name]
    proc = dyntta(*CASES[name][0], cwd=d)
    _, real = proc.communicate(timeout=300)
    assert "Traceback" not in real, real
    assert (proc.returncode, real.strip().splitlines()[-1]) == (code, err.strip().splitlines()[-1])


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
    args = [*BENCH, "--out", "big", "--methods", "source", "tbn", "--seeds", *map(str, range(8)),
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
    assert 1 <= len(before) < 16, "the interrupt came after the grid finished"
    resumed = dyntta(*args, cwd=tmp_path)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    after = [json.loads(line) for line in results.read_text().splitlines()]
    assert after[: len(before)] == before
    assert len({r["key"] for r in after}) == len(after) == 16


def test_a_torn_line_in_the_middle_of_results_is_skipped_with_a_warning(outcomes):
    """A crash mid-append leaves a torn line that later appends bury in the middle: `report`
    skips it with a one-line warning naming it, and `bench` re-runs its cell."""
    d = outcomes["labels-negative"][2]
    whole = (d / "run" / "results.jsonl").read_text()
    (d / "torn").mkdir()
    (d / "torn" / "results.jsonl").write_text('{"key": "cut sh\n' + whole)
    out = io.StringIO()
    code, err = dyntta_here(["report", "torn/results.jsonl"], d, out)
    assert code == 0 and "Traceback" not in err, err
    assert err.startswith("dyntta report: warning: torn/results.jsonl: line 1 is not a whole "
                          "JSON record; skipped"), err
    assert "| source |" in out.getvalue()
    assert len(err.strip().splitlines()) == 1, err
    (d / "torn" / "results.jsonl").write_text('{"key": "cut sh\n')
    code, err = dyntta_here([*BENCH, "--out", "torn", "--cache-dir", "cache"], d)
    assert code == 0 and "Traceback" not in err, err
    rerun = json.loads((d / "torn" / "results.jsonl").read_text().splitlines()[-1])
    first = json.loads(whole)
    assert (rerun["key"], rerun["batch_correct"]) == (first["key"], first["batch_correct"])


def test_a_warm_make_c_prints_no_empty_progress_bar(tmp_path):
    write_inputs(tmp_path)
    args = ("make-c", "clean.npz", "c", "--severities", "5", "--corruptions", "fog")
    errs = []
    for _ in range(2):
        code, err = dyntta_here(list(args), tmp_path)
        assert code == 0, err
        errs.append(err)
    assert "make-c" in errs[0] and "chunk" in errs[0]  # the cold build shows its bar
    assert "chunk" not in errs[1] and "Traceback" not in errs[1], errs[1]


def test_make_c_keeps_the_users_files(tmp_path):
    """A folder holding the user's files (temporary-looking ones and a .parts folder included)
    is refused, untouched; in a folder of its own, a build removes only its own leftovers."""
    write_inputs(tmp_path)
    mine = tmp_path / "mine"
    (mine / ".parts" / "fog").mkdir(parents=True)
    files = {mine / ".notes.tmp": "draft", mine / ".parts" / "fog" / "keep.txt": "mine",
             mine / "data.txt": "data"}
    for path, text in files.items():
        path.write_text(text)
    args = ("--severities", "1", "--corruptions", "fog", "--no-progress")
    code, err = dyntta_here(["make-c", "clean.npz", "mine", *args], tmp_path)
    assert_one_error_line(code, err, "make-c", "mine is not empty")
    assert all(path.read_text() == text for path, text in files.items())
    built = tmp_path / "built"
    assert dyntta_here(["make-c", "clean.npz", "built", *args], tmp_path)[0] == 0
    leftover = built / ".fog.npy.x1y2.tmp"  # what a build killed while writing fog.npy leaves
    ours = {leftover: "", built / ".parts" / "snow" / "s1-c0.npy": ""}
    theirs = {built / ".notes.tmp": "draft", built / ".parts" / "notes" / "a.txt": "mine"}
    for path, text in {**ours, **theirs}.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    code, err = dyntta_here(["make-c", "clean.npz", "built", *args], tmp_path)
    assert code == 0, err
    assert not leftover.exists() and not (built / ".parts" / "snow").exists()
    assert all(path.read_text() == text for path, text in theirs.items())


def test_a_tilde_in_out_and_the_cache_is_the_home_folder(tmp_path, monkeypatch, capsys):
    write_inputs(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DYNTTA_CACHE", "~/cache")
    monkeypatch.chdir(tmp_path)
    assert main([*BENCH, "--out=~/run"]) == 0, capsys.readouterr().err
    assert (home / "run" / "results.jsonl").is_file() and (home / "cache").is_dir()
    assert not (tmp_path / "~").exists()


def test_a_value_set_as_a_bare_word_is_the_list_of_that_value(tmp_path):
    """``--set methods=dyn`` (a shell takes the quotes of ``methods="dyn"``) runs dyn, not the
    methods 'd', 'y', 'n'; the same for a scenario."""
    write_inputs(tmp_path)
    code, err = dyntta_here([*BENCH[:4], "--set", "methods=tbn", "--set",
                             "stream.scenarios=random", "--out", "bare"], tmp_path)
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "bare" / "results.jsonl").open()]
    assert [(r["config"]["method"], r["config"]["scenario"]) for r in records] == [("tbn", "random")]
