"""The README's "Benchmark your own model" runs as written in a fresh folder: its shell block
(a module file, a short training run, a grid, ``dyntta bench``, ``dyntta report``) prints the
table the README shows where the training gives the weights the README names (on another kind of
CPU, a table of the same rows), and its Python block runs as pasted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SECTION = "Benchmark your own model"


def section() -> str:
    parts = re.split(r"\n## ", (REPO / "README.md").read_text())
    return next(s for s in parts if s.startswith(SECTION))


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section(), re.S)


def after_shell_block() -> str:
    """What the README shows after its shell block: its words on the table, then the table."""
    return section().split("```sh", 1)[1].split("```", 2)[1].split("From Python")[0]


def table_rows(text: str) -> dict[str, list[float]]:
    """Each table row's label and its accuracies (the means of ``mean ± h``, or of ``mean (n
    batches)`` where a run had too few batches for an interval)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) > 1 and re.match(r"[\d.]+ (±|\()", cells[1]):
            rows[cells[0]] = [float(c.split()[0]) for c in cells[1:]]
    return rows


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """This tree's package, the interpreter running the tests first on PATH, a fresh cache."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "PATH": path,
            "DYNTTA_CACHE": str(tmp_path_factory.mktemp("cache"))}


def test_the_shell_example_prints_the_table_shown(tmp_path, env):
    (script,) = code_blocks("sh")
    done = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    shown = after_shell_block()
    printed, expected = table_rows(done.stdout.split("results and report in")[0]), table_rows(shown)
    assert list(printed) == list(expected) == ["source", "alpha_bn", "dyn", "tbn"]
    records = (tmp_path / "runs" / "mynet" / "results.jsonl").read_text().splitlines()
    (weights,) = {json.loads(line)["config"]["source"]["weights_sha256"] for line in records}
    words = " ".join(shown.split("| method")[0].split())
    if f"`weights_sha256` in each record is `{weights}`" in words:
        assert printed == expected  # the weights the README's table came from: the same table
    for values in printed.values():  # any weights: accuracies, then their mean
        assert all(0 <= v <= 100 for v in values)
        assert values[-1] == pytest.approx(sum(values[:-1]) / len(values[:-1]), abs=0.1)
    report = (tmp_path / "runs" / "mynet" / "report" / "table.md").read_text()
    assert table_rows(report) == printed


def test_the_python_example_runs(tmp_path, env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DYNTTA_CACHE", env["DYNTTA_CACHE"])
    (code,) = code_blocks("python")
    namespace: dict = {}
    exec(code, namespace)
    result = namespace["result"]
    assert len(result.records) == 3 and {r["model"] for r in result.records} == {"my-cnn"}
    assert set(table_rows(result.table)) == {"source", "tbn", "dyn"}
    assert (tmp_path / "runs" / "my-cnn" / "results.jsonl").is_file()
