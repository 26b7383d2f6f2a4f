"""Run a benchmark grid from Python on any model: ``dyntta.bench.run(grid, model=...)``."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from torch import nn

from dyntta.bench.config import Grid, load_grid, parse_grid
from dyntta.bench.report import table, write_report
from dyntta.bench.runner import run_grid
from dyntta.bench.sources import ModelResolver, SourceOptions, resolve_source


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """What :func:`run` returns: the records of the grid's cells (one per dataset, stream,
    method and seed, as in ``results.jsonl``), their Markdown table and the run folder."""

    records: list[dict[str, Any]]
    table: str
    out: Path


def run(
    grid: Grid | dict[str, Any] | str | os.PathLike,
    model: nn.Module | str | None = None,
    *,
    name: str | None = None,
    checkpoint: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    data_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    workers: int = 1,
    device: str = "cpu",
    progress: bool = False,
) -> BenchRun:
    """Run every unfinished cell of ``grid`` and write its report, as ``dyntta bench`` does.

    Args:
        grid: a grid file (TOML, see :mod:`dyntta.bench.config`), the same as a dict, or a
            :class:`~dyntta.bench.config.Grid`.
        model: the model to adapt on every dataset of the grid, instead of the grid's: an
            ``nn.Module`` mapping images (B, 3, H, W) in [0, 1] to logits (B, classes) (its
            input normalisation inside), or a factory's import path ``package.module:function``
            (``dyntta bench --model``). None: the grid's models.
        name: how records name a module ``model`` (default: its class name).
        checkpoint: a state dict loaded into the factory's module, or a checkpoint of a known
            architecture (``--checkpoint``); not with a module ``model``.
        out: the run folder (default ``runs/<grid title>``); a re-run skips the cells whose
            records are there (same configuration, model, data and test rows).
        data_dir, cache_dir, workers, device, progress: as the options of ``dyntta bench``.
    """
    if not isinstance(grid, Grid):
        grid = parse_grid(grid) if isinstance(grid, dict) else load_grid(grid)
    options = SourceOptions(optional_str(data_dir), optional_str(cache_dir))
    if isinstance(model, nn.Module):
        if checkpoint is not None:
            raise ValueError("checkpoint= goes with a factory or a known architecture; load the "
                             "weights into a model object yourself")
        resolver = ModelResolver(model, name or type(model).__name__)
    elif model is None or isinstance(model, str):
        if name is not None:
            raise ValueError("name= names a model object; a factory or checkpoint is named by "
                             "its path")
        options = dataclasses.replace(options, checkpoint=optional_str(checkpoint), model=model)
        resolver = resolve_source
    else:
        raise ValueError(f"model must be a torch.nn.Module, a factory's import path "
                         f"'package.module:function' or None, got {type(model).__name__}")
    folder = Path(out) if out is not None else Path("runs") / slug(grid.title)
    records = run_grid(grid, folder / "results.jsonl", options, workers, device, progress,
                       resolver)
    write_report(records, folder, grid.title)
    return BenchRun(records, table(records, grid.columns)[0], folder)


def optional_str(path: str | os.PathLike | None) -> str | None:
    return None if path is None else os.fspath(path)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "run"
