"""The runner: correct records, provenance, resumability, torn-write recovery, one record per
cell, worker-count invariance."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import dyntta
from dyntta.bench.config import load_grid
from dyntta.bench.results import append_record, drop_torn_tail, read_results, run_lock
from dyntta.bench.runner import bind, run_cell, run_grid
from dyntta.data import make_stream
from dyntta.data.datasets import to_tensor
from dyntta.models import save_checkpoint
from tests.bench.helpers import GRID_TOML, tiny_source
from tests.conftest import tiny_resnet


@pytest.fixture
def grid(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID_TOML)
    return load_grid(path)


def test_record_accuracy_equals_an_independent_count(grid):
    cell = next(c for c in grid.cells() if c.method == "dyn" and c.scenario == "crossmix")
    source = tiny_source()
    record = run_cell(cell, source)
    stream = make_stream(source.dataset, n_domains=3, scenario="crossmix", batch_size=16, seed=cell.seed)
    method = dyntta.adapt(source.model, "dyn")
    hits = {d.corruption: [] for d in stream.domains}
    for batch in stream:
        ok = (method(batch.x).argmax(1) == batch.y).tolist()
        for d, h in zip(batch.domain.tolist(), ok):
            hits[stream.domains[d].corruption].append(h)
    total = sum(map(sum, hits.values())) / sum(map(len, hits.values()))
    assert record["accuracy"] == pytest.approx(total)
    assert record["per_domain"] == pytest.approx({k: sum(v) / len(v) for k, v in hits.items()})
    assert record["n_samples"] == 120 and record["key"] == bind(cell, source).key
    assert record["config"]["method"] == "dyn" and record["images_per_s"] > 0
    assert record["peak_memory_mb"] > 0
    assert record["batch_n"] == [len(b.y) for b in stream]
    assert sum(record["batch_correct"]) == sum(map(sum, hits.values()))


def test_dyn_adaptive_reads_the_source_s_clean_images_and_its_record_says_how_many(grid):
    """Its record is that of the method adapted with the source's reference; other methods,
    and a source without one, read none."""
    cell = next(c for c in grid.cells() if c.method == "dyn" and c.scenario == "crossmix")
    cell = dataclasses.replace(cell, method="dyn_adaptive")
    source = tiny_source()
    source.reference = np.random.default_rng(1).integers(0, 256, (40, 8, 8, 3), dtype=np.uint8)
    record = run_cell(cell, source)
    method = dyntta.adapt(source.model, "dyn_adaptive", reference=to_tensor(source.reference))
    stream = make_stream(source.dataset, n_domains=3, scenario="crossmix", batch_size=16,
                         seed=cell.seed)
    assert record["batch_correct"] == [int((method(b.x).argmax(1) == b.y).sum()) for b in stream]
    assert record["reference_images"] == 40 and method.source_ratios
    assert run_cell(dataclasses.replace(cell, method="tbn"), source)["reference_images"] == 0
    source.reference = None
    assert run_cell(cell, source)["reference_images"] == 0


def test_records_carry_their_provenance(grid):
    source = tiny_source()
    cells = [c for c in grid.cells() if c.scenario == "crossmix"]
    records = [run_cell(c, source) for c in cells]
    for cell, r in zip(cells, records):
        assert r["checkpoint_sha256"] == "tiny-model" and r["protocol"] == "dyn-paper"
        assert r["seed"] == cell.seed and r["metric"] == "top-1 accuracy"
        assert r["evaluation"].startswith("online") and "never reset" in r["evaluation"]
        assert r["config"]["protocol"] == "dyn-paper" and r["n_samples"] == sum(r["batch_n"])
    # the fingerprint names the test rows: equal for methods on one stream, not across seeds
    prints = {(r["config"]["seed"], r["config"]["method"]): r["rows_fingerprint"] for r in records}
    assert prints[(0, "source")] == prints[(0, "dyn")] != prints[(1, "dyn")]


def test_rerun_skips_finished_cells_and_resumes_after_interruption(grid, tmp_path):
    results = tmp_path / "run" / "results.jsonl"
    first = run_grid(grid, results, progress=False, resolver=tiny_source)
    assert len(first) == len(grid.cells())
    assert all(r["versions"]["torch"] == torch.__version__ for r in first)
    lines = results.read_text().splitlines()
    # Interrupted run: two cells lost, the last record torn in the middle of its line.
    results.write_text("\n".join(lines[:-3]) + "\n" + lines[-3][:40])
    with pytest.warns(UserWarning, match="line 10 is not a whole JSON record"):
        assert len(read_results(results)) == len(lines) - 3
    again = run_grid(grid, results, progress=False, resolver=tiny_source)
    assert len(results.read_text().splitlines()) == len(lines)
    by_key = {r["key"]: r["accuracy"] for r in first}
    assert {r["key"]: r["accuracy"] for r in again} == by_key


def test_workers_give_the_same_records_as_one_process(grid, tmp_path):
    one = run_grid(grid, tmp_path / "a.jsonl", progress=False, resolver=tiny_source)
    two = run_grid(grid, tmp_path / "b.jsonl", workers=2, progress=False, resolver=tiny_source)
    strip = lambda rs: {r["key"]: (r["accuracy"], r["per_domain"]) for r in rs}  # noqa: E731
    assert strip(one) == strip(two)


def test_torn_lines_are_skipped_with_a_warning_and_duplicates_count_once(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, {"key": "a", "accuracy": 0.5})
    path.write_text(path.read_text() + '{"key": "b", "acc\n[1]\n' + json.dumps({"key": "c"})
                    + "\n" + json.dumps({"key": "a", "accuracy": 0.9}) + "\n")
    with pytest.warns(UserWarning) as caught:
        records = read_results(path)
    assert records == [{"key": "a", "accuracy": 0.5}, {"key": "c"}]
    messages = [str(w.message) for w in caught]
    assert any("line 2 is not a whole JSON record" in m for m in messages)
    assert any("line 3 is not a whole JSON record" in m for m in messages)
    assert any("line 5 repeats cell a" in m for m in messages)
    path.write_text('{"key": "a"}\n{"key": "b", "acc')
    drop_torn_tail(path)
    assert path.read_text() == '{"key": "a"}\n'
    assert read_results(tmp_path / "missing.jsonl") == []


def test_a_run_folder_has_one_writer(tmp_path):
    results = tmp_path / "results.jsonl"
    with run_lock(results):
        with pytest.raises(RuntimeError, match=f"being written by process {os.getpid()}"):
            with run_lock(results):
                pass
    with run_lock(results):  # released
        pass


def test_two_bench_runs_at_once_record_each_cell_once(tmp_path):
    """Two real ``dyntta bench`` processes on one --out: one refuses with a clear message or both
    finish, and the results file holds one record per cell either way."""
    data = np.random.default_rng(0)
    np.savez(tmp_path / "clean.npz", x=data.integers(0, 256, (16, 32, 32, 3), dtype=np.uint8),
             y=data.integers(0, 3, 16))
    save_checkpoint(tiny_resnet(), tmp_path / "tiny.pt", classes=["a", "b", "c"])
    base = [sys.executable, "-m", "dyntta.cli", "bench", "--dataset", "npz", "--dataset-path",
            str(tmp_path / "clean.npz"), "--checkpoint", str(tmp_path / "tiny.pt"),
            "--cache-dir", str(tmp_path / "cache"), "--set", "stream.batch_sizes=[8]",
            "--set", "stream.n_domains=[3]", "--no-progress"]
    # build the corrupted set once, so that both processes race on the cells themselves
    subprocess.run([*base, "--methods", "source", "--set", 'stream.scenarios=["continual"]',
                    "--out", str(tmp_path / "warm")], check=True, capture_output=True)
    args = [*base, "--out", str(tmp_path / "run"), "--methods", "source", "tbn", "--seeds", "0"]
    with run_lock(tmp_path / "run" / "results.jsonl"):  # held here: the real command refuses
        held = subprocess.run(args, capture_output=True, text=True)
    assert held.returncode == 2 and "Traceback" not in held.stderr
    assert f"being written by process {os.getpid()}" in held.stderr
    first, second = (subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for _ in range(2))
    outcomes = [(p.wait(timeout=300), p.stderr.read()) for p in (first, second)]
    assert any(rc == 0 for rc, _ in outcomes)
    for rc, err in outcomes:
        if rc != 0:
            assert "being written by process" in err and "Traceback" not in err
    lines = (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    keys = [json.loads(line)["key"] for line in lines]
    assert len(keys) == len(set(keys)) == 3 * 2  # scenarios x methods
