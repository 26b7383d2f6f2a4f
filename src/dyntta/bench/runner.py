"""Run the cells of a grid: one stream, one method, one seed each; one record per cell.

Records go to a JSON-lines results file as cells finish; a re-run skips the cells already there
(resumable), and an interrupted run loses at most the cells in progress. One process at a time
owns a results file (a lock), so no cell is recorded twice. Cells are independent and seeded,
so running them in parallel worker processes or as cluster jobs gives the same records;
wherever they run, this process alone appends to the results file.

Every record carries its provenance: the cell's full configuration (with the protocol and the
identity of the model and data, :attr:`~dyntta.bench.sources.Source.identity`), the checkpoint's
sha256, the model's factory, a fingerprint of the test rows streamed, the evaluation policy, the
metric, hits and sizes of every batch (for the intervals of :mod:`dyntta.bench.stats`), versions
and the git revision. A cell's key covers its configuration, the model and data identity and the
test rows, so a re-run with another checkpoint, factory or model, or with a data file replaced,
runs its cells anew instead of reusing those of the other model or data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import resource
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

import dyntta
from dyntta.bench.config import Cell, DatasetEntry, Grid
from dyntta.bench.executors import CellsFailed, Executor, Failure, make_executor
from dyntta.bench.results import (
    append_record,
    drop_torn_tail,
    finished_keys,
    read_results,
    run_lock,
)
from dyntta.bench.sources import Source, SourceOptions, cache_root, resolve_source
from dyntta.data import Stream, make_stream
from dyntta.data.datasets import to_tensor
from dyntta.methods.registry import method_class

EVALUATION = "online: each batch predicted before the method adapts on it, one pass, never reset"
METRIC = "top-1 accuracy"


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "dyntta": dyntta.__version__,
    }


def git_revision() -> str | None:
    """The git commit of the dyntta source tree (``+dirty`` if modified), or None."""
    here = Path(dyntta.__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
            timeout=10, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+dirty" if dirty else "")


def provenance(grid: Grid) -> dict[str, Any]:
    """What every record of ``grid`` carries besides its cell's own: the versions of the
    packages, the git revision of the source and the grid's title."""
    return {"versions": versions(), "git_revision": git_revision(), "grid": grid.title}


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: CUDA allocator peak on a GPU, else peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rows_fingerprint(stream: Stream) -> str:
    """sha256 (16 hex digits) of what the stream tests on: per batch, the dataset rows, their
    domains (corruption, severity) and labels, in order."""
    digest = hashlib.sha256()
    digest.update(json.dumps([(d.corruption, d.severity) for d in stream.domains]).encode())
    for plan in stream.plan:
        digest.update(np.ascontiguousarray(plan, dtype=np.int64).tobytes())
        digest.update(stream.dataset.labels[plan[:, 0]].astype(np.int64).tobytes())
    return digest.hexdigest()[:16]


STREAM_FIELDS = ("n_domains", "severity", "scenario", "batch_size", "rounds", "seed", "delta",
                 "n_samples")
"""The fields of a :class:`Cell` (and of its record's ``config``) that plan its stream: the
arguments of :func:`~dyntta.data.make_stream` of the same names."""


def stream_of(cell: Cell, source: Source) -> Stream:
    """The test stream of ``cell`` over ``source``'s dataset."""
    return make_stream(source.dataset, **{name: getattr(cell, name) for name in STREAM_FIELDS})


def bind(cell: Cell, source: Source, stream: Stream | None = None) -> Cell:
    """``cell`` with the identity of ``source`` and the fingerprint of its stream (``stream``,
    or planned here), which its key covers."""
    rows = rows_fingerprint(stream_of(cell, source) if stream is None else stream)
    return dataclasses.replace(cell, source=source.identity, rows=rows)


def plan(cell: Cell, source: Source) -> Cell:
    """``cell`` bound to ``source`` (:func:`bind`), or as it is if its stream cannot be planned
    on that data: it then fails where it runs, with the reason, and the other cells go on."""
    try:
        return bind(cell, source)
    except (ValueError, FileNotFoundError):
        return cell


def run_cell(cell: Cell, source: Source, device: str = "cpu", progress: bool = False) -> dict:
    """Adapt ``source.model`` with ``cell.method`` along the cell's stream; return its record.
    A cell already bound (:func:`bind`) to another model, data or rows than ``source``'s here is
    a ``ValueError``."""
    dev = torch.device(device)
    stream = stream_of(cell, source)
    bound = bind(cell, source, stream)
    if cell.rows is not None and bound != cell:
        raise ValueError(f"cell {cell.key}: the model or test data here differ from those the "
                         f"run was planned with ({dict(cell.source)}, rows {cell.rows}; here "
                         f"{dict(bound.source)}, rows {bound.rows})")
    torch.manual_seed(cell.seed)
    reads = method_class(cell.method).reads_reference and source.reference is not None
    reference = {"reference": to_tensor(source.reference)} if reads else {}
    method = dyntta.adapt(source.model, cell.method, compile=cell.compile_option, **reference,
                          **dict(cell.options))
    method = method.to(dev)
    n_domains = len(stream.domains)
    correct = torch.zeros(n_domains, dtype=torch.long)
    seen = torch.zeros(n_domains, dtype=torch.long)
    batch_correct, batch_n = [], []
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    start = time.perf_counter()
    for batch in tqdm(stream, desc=f"{cell.method} {cell.scenario}", disable=not progress,
                      leave=False):
        logits = method(batch.x.to(dev, non_blocking=True))
        hit = (logits.argmax(1).cpu() == batch.y).long()
        correct += torch.bincount(batch.domain, weights=hit, minlength=n_domains).long()
        seen += torch.bincount(batch.domain, minlength=n_domains)
        batch_correct.append(int(hit.sum()))
        batch_n.append(len(hit))
    wall = time.perf_counter() - start
    n = int(seen.sum())
    return {
        "key": bound.key,
        "config": bound.to_dict(),
        "model": source.model_name,
        "model_factory": source.model_factory,
        "accuracy": float(correct.sum()) / n,
        "per_domain": {
            d.corruption: float(c) / int(s) for d, c, s in zip(stream.domains, correct, seen)
        },
        "n_samples": n,
        "n_batches": len(stream),
        "batch_correct": batch_correct,
        "batch_n": batch_n,
        "metric": METRIC,
        "evaluation": EVALUATION,
        "protocol": cell.protocol,
        "seed": cell.seed,
        "checkpoint_sha256": source.checkpoint_sha256,
        "rows_fingerprint": bound.rows,
        "reference_images": len(source.reference) if reads else 0,
        "wall_s": wall,
        "images_per_s": n / wall,
        "peak_memory_mb": peak_memory_mb(dev),
        "device": str(dev),
        "threads": torch.get_num_threads(),
    }


_SOURCES: dict[Any, Source] = {}


Resolver = Callable[[DatasetEntry, SourceOptions, bool, bool], Source]


def source_for(cell: Cell, resolver: Resolver, options: SourceOptions, progress: bool,
               quiet: bool = False) -> Source:
    """The cell's source, resolved once per run and process (per resolver, dataset and
    options); ``quiet``: without the checks whose only outcome is a warning."""
    key = (resolver, cell.dataset, options)
    if key not in _SOURCES:
        _SOURCES[key] = resolver(cell.dataset, options, progress, quiet)
    return _SOURCES[key]


@dataclasses.dataclass(frozen=True)
class CellJob:
    """Runs one cell wherever an executor puts it (picklable): resolves the cell's source once
    per process (quietly: the run's own process resolved it first and warned), sets
    ``threads`` torch threads if given, returns the cell's record."""

    resolver: Resolver
    options: SourceOptions
    device: str = "cpu"
    threads: int | None = None
    progress: bool = False

    def __call__(self, cell: Cell) -> dict:
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        source = source_for(cell, self.resolver, self.options, self.progress, quiet=True)
        return run_cell(cell, source, self.device, self.progress)


def run_grid(
    grid: Grid,
    results: str | os.PathLike,
    options: SourceOptions = SourceOptions(),
    workers: int = 1,
    device: str = "cpu",
    progress: bool = True,
    resolver: Resolver = resolve_source,
    executor: Executor | None = None,
) -> list[dict]:
    """Run every unfinished cell of ``grid``, appending records to ``results``.

    Args:
        grid: the cells to run; ``grid.executor`` says where (see :mod:`dyntta.bench.executors`).
        results: the JSON-lines results file (created or appended to); this process is its only
            writer, whatever the executor.
        options: where data, checkpoints and caches are.
        workers: parallel worker processes (1: run here) for the ``process`` executor.
        device: torch device for the methods.
        progress: show progress bars.
        resolver: ``(dataset entry, options, progress, quiet) -> Source``;
            :func:`resolve_source`.
        executor: overrides the one ``grid.executor`` and ``workers`` ask for.

    Returns the records of the grid's cells (with this model and data) in the results file.
    Raises :class:`~dyntta.bench.executors.CellsFailed` after the other cells finished if some
    failed (a re-run runs only those).
    """
    results = Path(results)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    with run_lock(results):
        keys = run_unfinished(grid, results, options, workers, device, progress, resolver,
                              executor)
    return [r for r in read_results(results) if r.get("key") in keys]


def run_unfinished(grid: Grid, results: Path, options: SourceOptions, workers: int, device: str,
                   progress: bool, resolver: Resolver, executor: Executor | None) -> set[str]:
    """Run the cells of ``grid`` without a record in ``results`` (which the caller holds);
    return the keys of all its cells, bound to their sources (:func:`bind`)."""
    # build only what the streams read: the grid's severity, its first domains
    options = dataclasses.replace(options, severities=(grid.severity,),
                                  domains=max(grid.n_domains))
    if executor is None:
        executor = make_executor(grid.executor, workers, results.parent / "slurm",
                                 cache_root(options))
    drop_torn_tail(results)
    done = finished_keys(read_results(results))
    _SOURCES.clear()  # a file replaced since an earlier run in this process is read anew
    # opening every source builds its caches (corrupted sets) once, before any worker or job
    cells = [plan(c, source_for(c, resolver, options, progress)) for c in grid.cells()]
    todo = [c for c in cells if c.key not in done]
    stamp = provenance(grid)
    bar = tqdm(total=len(cells), initial=len(cells) - len(todo), desc=grid.title,
               disable=not progress, unit="cell")
    in_here = executor.threads is None  # this process: progress bars, threads left alone
    job = CellJob(resolver, options, device, executor.threads, progress and in_here)
    failures = []
    with contextlib.closing(executor.map(job, todo)) as outcomes:
        for cell, outcome in outcomes:
            if isinstance(outcome, Failure):
                failures.append(outcome)
            else:
                append_record(results, {**outcome, **stamp})
            bar.update()
    bar.close()
    if failures:
        raise CellsFailed(failures)
    return {c.key for c in cells}
