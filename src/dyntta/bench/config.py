"""Benchmark grids: a TOML file describes datasets x streams x methods x seeds.

A grid file has these tables (every key optional except where noted; an unknown key is an error)::

    title = "Table 1"
    seeds = [0]
    protocol = "dyn-paper"                      # or "published" (see dyntta.bench.protocols)
    compile = false                             # true: torch.compile the backward-free methods'
                                                # networks (fine-tuning methods run eagerly); or
                                                # torch.compile's arguments: { backend = "eager" }
    methods = ["source", "tbn", "dyn"]          # default: every registered method
    columns = ["dataset", "scenario"]           # table columns (default: the fields that vary)

    [stream]                                    # each list is a grid axis
    scenarios = ["crossmix", "random", "shuffle"]
    batch_sizes = [64]
    n_domains = [15]
    rounds = [1]
    deltas = [0.01]                             # only used by scenario "wild"
    severity = 5
    n_samples = 1000                            # dataset rows per domain, NOT test images: the same
                                                # rows in every domain, so a CrossMix stream tests
                                                # n_samples x n_domains images (default: "all")

    [[datasets]]                                # at least one
    name = "cifar10-c"                          # see dyntta.bench.sources.DATASETS
    path = "CIFAR-10-C"                         # relative to --data-dir unless absolute
    checkpoint = "resnet50-cifar10.pt"          # relative to --data-dir unless absolute
    model = "mypackage.models:build"            # a factory returning an nn.Module (--model); the
                                                # checkpoint, if given, is loaded into it
    family = "cifar10"                          # cifar10 / cifar100 / imagenet (for "published"
                                                # and --paper; implied by the cifar*/imagenet-c
                                                # names; digits has none)
    options.dyn_adaptive = { prior_strength = 4.0 }  # this model's method options, over [options]

    [options.dyn]                               # per-method options (the method's Config fields)
    alpha = 0.8

    [executor]                                  # where cells run (see dyntta.bench.executors)
    kind = "process"                            # or "slurm": one Slurm job per cell (submitit)
    slurm_partition = "gpu"                     # default: the cluster's default partition
    slurm_time = 60                             # minutes per cell
    gpus_per_cell = 0
    cpus_per_cell = 1                           # also the torch threads of a cell
    array_parallelism = 64                      # cells running at once

Command-line overrides use dotted keys with TOML values: ``stream.batch_sizes=[16, 64]``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Callable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from dyntta.bench.protocols import (
    DATASET_FAMILIES,
    FAMILIES,
    NO_FAMILY,
    PROTOCOLS,
    protocol_options,
)
from dyntta.data import SCENARIOS
from dyntta.data.corruptions import RECIPES
from dyntta.methods import available_methods, method_class
from dyntta.methods.base import config_from_options

TOP_KEYS = {"title", "seeds", "methods", "columns", "stream", "datasets", "options", "protocol",
            "compile", "executor"}
STREAM_KEYS = {"scenarios", "batch_sizes", "n_domains", "rounds", "deltas", "severity", "n_samples"}
DATASET_KEYS = {"name", "path", "checkpoint", "family", "model", "recipe", "options"}
EXECUTORS = ("process", "slurm")
COLUMN_KEYS = ("dataset", "scenario", "batch_size", "n_domains", "rounds", "delta", "severity")


@dataclasses.dataclass(frozen=True)
class DatasetEntry:
    """A dataset of the grid: its kind, where its files are, which model to adapt (a checkpoint,
    a factory's import path ``package.module:function``, or both), its family (``cifar10`` /
    ``cifar100`` / ``imagenet``: which published hyper-parameters apply) and, for ``npz``, the
    corruption recipe (``cifar`` / ``imagenet``; None: by image size, which only 32 x 32 and
    224 x 224 images have); ``options``, (method, ((field, value), ...)) pairs, are this
    dataset's method options, over the grid's (e.g. those
    :func:`~dyntta.methods.source_weights.calibrate_source_weights` reads for its model)."""

    name: str
    path: str | None = None
    checkpoint: str | None = None
    family: str | None = None
    model: str | None = None
    recipe: str | None = None
    options: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    def method_options(self, method: str) -> dict[str, Any]:
        """This dataset's options for ``method`` (empty where it sets none)."""
        return dict(dict(self.options).get(method, ()))


@dataclasses.dataclass(frozen=True)
class ExecutorSpec:
    """Where the cells run: ``process`` (here, or ``--workers`` local processes) or ``slurm``
    (one job per cell through submitit). ``slurm_time`` is in minutes; ``slurm_partition`` None
    is the cluster's default; ``cpus_per_cell`` is also each job's torch thread count."""

    kind: str = "process"
    slurm_partition: str | None = None
    slurm_time: int = 60
    gpus_per_cell: int = 0
    cpus_per_cell: int = 1
    array_parallelism: int = 64


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run: a stream of one dataset, one method with its options (those of ``protocol``
    and the grid's), one seed; once bound to its source (:func:`dyntta.bench.runner.bind`), also
    what identifies the model and data (``source``) and the test rows (``rows``) it runs on."""

    dataset: DatasetEntry
    scenario: str
    batch_size: int
    n_domains: int
    rounds: int
    delta: float | None
    severity: int
    n_samples: int | None
    method: str
    options: tuple[tuple[str, Any], ...]
    seed: int
    protocol: str
    compile: bool | tuple[tuple[str, Any], ...] = False
    """Whether the method's network runs compiled: ``False``, ``True`` or ``torch.compile``'s
    arguments as sorted (name, value) pairs."""
    source: tuple[tuple[str, Any], ...] = ()
    """:attr:`dyntta.bench.sources.Source.identity` of the model and data the cell runs on."""
    rows: str | None = None
    """:func:`dyntta.bench.runner.rows_fingerprint` of the cell's stream."""

    @property
    def compile_option(self) -> bool | dict[str, Any]:
        """``compile=`` of :func:`dyntta.adapt`."""
        return self.compile if isinstance(self.compile, bool) else dict(self.compile)

    def to_dict(self) -> dict[str, Any]:
        """The configuration, with ``source`` as a dict; without ``rows`` (a record carries it
        as ``rows_fingerprint``)."""
        d = dataclasses.asdict(self)
        d["options"] = dict(self.options)
        d["compile"] = self.compile_option
        d["source"] = dict(self.source)
        del d["rows"]
        if self.dataset.recipe is None:  # the recipe by image size: keys as without the field
            del d["dataset"]["recipe"]
        del d["dataset"]["options"]  # in ``options``: the same key as set for the whole grid
        return d

    @property
    def key(self) -> str:
        """A stable identifier of everything the cell's result depends on: its configuration,
        model and data (``source``) and test rows (hex digest of their JSON)."""
        blob = json.dumps([self.to_dict(), self.rows], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Grid:
    """A parsed grid file (see the module docstring)."""

    title: str
    datasets: tuple[DatasetEntry, ...]
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    scenarios: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    n_domains: tuple[int, ...]
    rounds: tuple[int, ...]
    deltas: tuple[float, ...]
    severity: int
    n_samples: int | None
    options: dict[str, dict[str, Any]]
    columns: tuple[str, ...] | None
    protocol: str
    compile: bool | tuple[tuple[str, Any], ...] = False
    executor: ExecutorSpec = ExecutorSpec()

    def cells(self) -> list[Cell]:
        """Every cell of the grid, datasets outermost, seeds innermost."""
        out = []
        for ds, scenario, b, nd, r in itertools.product(
            self.datasets, self.scenarios, self.batch_sizes, self.n_domains, self.rounds
        ):
            for delta in self.deltas if scenario == "wild" else (None,):
                for method, seed in itertools.product(self.methods, self.seeds):
                    opts = {**protocol_options(method, self.protocol, ds.family),
                            **self.options.get(method, {}), **ds.method_options(method)}
                    cls = method_class(method)
                    config_from_options(cls.Config, opts)  # valid together
                    out.append(
                        Cell(ds, scenario, b, nd, r, delta, self.severity, self.n_samples,
                             method, tuple(sorted(opts.items())), seed, self.protocol,
                             False if cls.backward else self.compile)
                    )
        return out


def load_grid(path: str | Path, overrides: list[str] = ()) -> Grid:
    """Read a grid file and apply ``key=value`` overrides (TOML values, dotted keys)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"grid file not found: {path}")
    try:
        raw = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file (byte {exc.start}); a grid is TOML "
                         "text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    for item in overrides:
        apply_override(raw, item, str(path))
    return parse_grid(raw, str(path))


def apply_override(raw: dict[str, Any], item: str, where: str = "grid") -> None:
    """Set ``raw[a][b] = value`` for ``item = "a.b=value"`` (value parsed as TOML; a bare word
    is a string)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {item!r} must look like key=value, e.g. stream.batch_sizes=[16]")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text  # a bare word is a string
    *parents, leaf = key.strip().split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"{where}: override {item!r}: {part!r} is not a table")
    node[leaf] = value


def parse_grid(raw: dict[str, Any], where: str = "grid") -> Grid:
    """Validate a grid dict (as read from TOML) into a :class:`Grid`; every error names the
    file (``where``) and the key at fault."""
    check_keys(raw, TOP_KEYS, where)
    stream = raw.get("stream", {})
    check_keys(stream, STREAM_KEYS, f"{where}: [stream]")
    methods = names(raw.get("methods", available_methods()), "methods", where)
    for m in methods:
        known(method_class, m, "methods", where)
    options = raw.get("options", {})
    check_method_options(options, f"{where}: [options]", lambda m: f"{where}: [options.{m}]")
    scenarios = names(stream.get("scenarios", ["crossmix", "random", "shuffle"]),
                      "stream.scenarios", where, SCENARIOS)
    protocol = raw.get("protocol", "dyn-paper")
    if protocol not in PROTOCOLS:
        raise ValueError(f"{where}: protocol: unknown protocol {protocol!r}; valid: "
                         f"{', '.join(PROTOCOLS)}")
    columns = names(raw["columns"], "columns", where, COLUMN_KEYS) if "columns" in raw else None
    title = raw.get("title", Path(where).stem)
    if not isinstance(title, str):
        raise ValueError(f"{where}: title must be a string, got {title!r}")
    grid = Grid(
        title=title,
        datasets=parse_datasets(raw.get("datasets"), where),
        methods=methods,
        seeds=integers(raw.get("seeds", [0]), "seeds", where, low=0),
        scenarios=scenarios,
        batch_sizes=integers(stream.get("batch_sizes", [64]), "stream.batch_sizes", where),
        n_domains=integers(stream.get("n_domains", [15]), "stream.n_domains", where),
        rounds=integers(stream.get("rounds", [1]), "stream.rounds", where),
        deltas=numbers(stream.get("deltas", [0.01]), "stream.deltas", where),
        severity=severity(stream.get("severity", 5), where),
        n_samples=row_count(stream.get("n_samples", "all"), where),
        options={m: dict(o) for m, o in options.items()},
        columns=columns,
        protocol=protocol,
        compile=compile_setting(raw.get("compile", False), where),
        executor=parse_executor(raw.get("executor", {}), where),
    )
    try:
        grid.cells()
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return grid


def parse_datasets(value: Any, where: str) -> tuple[DatasetEntry, ...]:
    """The ``[[datasets]]`` entries: a non-empty array of tables, none repeated."""
    if isinstance(value, dict):
        raise ValueError(f"{where}: datasets must be an array of tables: write [[datasets]] "
                         "(two brackets) above each dataset, not [datasets]")
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: at least one [[datasets]] entry is needed")
    entries = []
    for i, d in enumerate(value):
        at = f"{where}: datasets[{i}]"
        check_keys(d, DATASET_KEYS, at)
        if "name" not in d:
            raise ValueError(f"{at}: 'name' is required")
        for key, text in d.items():
            if key != "options" and not isinstance(text, str):
                raise ValueError(f"{at}: {key} must be a string, got {text!r}")
        check_method_options(d.get("options", {}), f"{at}: options",
                             lambda m, at=at: f"{at}: options.{m}")
        if d["name"] in NO_FAMILY and "family" in d:
            raise ValueError(f"{at}: {d['name']} has no family (it is none of "
                             f"{', '.join(FAMILIES)}); remove 'family'")
        family = d.get("family", DATASET_FAMILIES.get(d["name"]))
        if family is not None and family not in FAMILIES:
            raise ValueError(f"{at}: unknown family {family!r}; valid: {', '.join(FAMILIES)}")
        if d["name"] == "digits" and "path" in d:
            raise ValueError(f"{at}: 'digits' is embedded and takes no path (for images of your "
                             "own use name = \"npz\" with path = the .npz file)")
        if "recipe" in d and d["name"] != "npz":
            raise ValueError(f"{at}: recipe is for 'npz' (images corrupted here); "
                             f"{d['name']} is not corrupted here: remove 'recipe'")
        if d.get("recipe", RECIPES[0]) not in RECIPES:
            raise ValueError(f"{at}: unknown recipe {d['recipe']!r}; valid: {', '.join(RECIPES)}")
        entry = DatasetEntry(**{**d, "family": family,
                                "options": frozen_options(d.get("options", {}))})
        seen = [dataclasses.replace(e, options=()) for e in entries]
        if (bare := dataclasses.replace(entry, options=())) in seen:
            raise ValueError(f"{at}: repeats datasets[{seen.index(bare)}] (one entry per "
                             "dataset and model, with its options)")
        entries.append(entry)
    return tuple(entries)


def known(lookup: Any, name: str, key: str, where: str) -> None:
    """Call ``lookup(name)`` (which raises naming the valid values), naming the key."""
    try:
        lookup(name)
    except ValueError as exc:
        raise ValueError(f"{where}: {key}: {exc}") from None


def names(value: Any, key: str, where: str, valid: Any = None) -> tuple[str, ...]:
    """A non-empty list of distinct strings (one string is a list of one), each in ``valid``
    if given."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or \
            not all(isinstance(v, str) for v in values):
        raise ValueError(f"{where}: {key} must be a non-empty list of names, got {value!r}")
    for v in values:
        if valid is not None and v not in valid:
            raise ValueError(f"{where}: {key}: unknown value {v!r}; valid: {', '.join(valid)}")
    no_repeats(values, key, where)
    return tuple(values)


def integers(value: Any, key: str, where: str, low: int = 1) -> tuple[int, ...]:
    """A non-empty list of distinct integers >= ``low`` (one integer is a list of one); a
    float such as 1.7 is refused, not truncated."""
    values = value if isinstance(value, list) else [value]
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < low
                         for v in values):
        raise ValueError(f"{where}: {key} must be a non-empty list of integers >= {low}, "
                         f"got {value!r}")
    no_repeats(values, key, where)
    return tuple(values)


def numbers(value: Any, key: str, where: str) -> tuple[float, ...]:
    """A non-empty list of distinct finite numbers > 0 (one number is a list of one)."""
    values = value if isinstance(value, list) else [value]
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float))
                         or not 0 < v < float("inf") for v in values):
        raise ValueError(f"{where}: {key} must be a non-empty list of numbers > 0, "
                         f"got {value!r}")
    no_repeats(values, key, where)
    return tuple(float(v) for v in values)


def no_repeats(values: list, key: str, where: str) -> None:
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"{where}: {key} lists {', '.join(repeated)} more than once (the same "
                         "cells would run twice)")


def severity(value: Any, where: str) -> int:
    """``stream.severity``: one integer in 1..5 (a grid runs one severity)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
        raise ValueError(f"{where}: stream.severity must be one integer in 1..5 (one severity "
                         f"per grid; run several grids for several), got {value!r}")
    return value


def compile_setting(value: Any, where: str) -> bool | tuple[tuple[str, Any], ...]:
    """The grid's ``compile``: a boolean, or a table of ``torch.compile`` arguments (checked
    here: their names, the backend and the mode)."""
    if isinstance(value, dict):
        check_compile_arguments(value, f"{where}: compile")
        return tuple(sorted(value.items()))
    if not isinstance(value, bool):
        raise ValueError(f"{where}: compile must be true, false or a table of torch.compile "
                         f"arguments, got {value!r}")
    return value


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_compile_arguments(arguments: dict[str, Any], where: str) -> None:
    """Raise ``ValueError`` naming the first argument ``torch.compile`` would not accept."""
    import inspect

    import torch

    valid = set(inspect.signature(torch.compile).parameters) - {"model"}
    check_keys(arguments, valid, where)
    backend = arguments.get("backend", "inductor")
    backends = torch._dynamo.list_backends(exclude_tags=())
    if not isinstance(backend, str) or backend not in backends:
        raise ValueError(f"{where}: unknown backend {backend!r}; valid: {', '.join(backends)}")
    mode = arguments.get("mode")
    if mode is not None and mode not in COMPILE_MODES:
        raise ValueError(f"{where}: unknown mode {mode!r}; valid: {', '.join(COMPILE_MODES)}")
    for flag in ("fullgraph", "disable"):
        if not isinstance(arguments.get(flag, False), bool):
            raise ValueError(f"{where}: {flag} must be true or false, got {arguments[flag]!r}")
    if not isinstance(arguments.get("options", {}), dict):
        raise ValueError(f"{where}: options must be a table, got {arguments['options']!r}")


def parse_executor(table: Any, where: str) -> ExecutorSpec:
    """Validate the ``[executor]`` table (see :class:`ExecutorSpec`)."""
    where = f"{where}: [executor]"
    check_keys(table, {f.name for f in dataclasses.fields(ExecutorSpec)}, where)
    spec = ExecutorSpec(**table)
    if spec.kind not in EXECUTORS:
        raise ValueError(f"{where}: unknown kind {spec.kind!r}; valid: {', '.join(EXECUTORS)}")
    if spec.slurm_partition is not None and not isinstance(spec.slurm_partition, str):
        raise ValueError(f"{where}: slurm_partition must be a string, got {spec.slurm_partition!r}")
    for name, low in (("slurm_time", 1), ("gpus_per_cell", 0), ("cpus_per_cell", 1),
                      ("array_parallelism", 1)):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{where}: {name} must be an int >= {low}, got {value!r}")
    return spec


def frozen_options(options: dict[str, dict[str, Any]]
                   ) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
    """A dataset's method options as :attr:`DatasetEntry.options`: sorted pairs, arrays as
    tuples, so that the entry is hashable."""
    def value(v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v

    return tuple(sorted((method, tuple(sorted((k, value(v)) for k, v in table.items())))
                        for method, table in options.items()))


def check_method_options(options: Any, where: str, method_where: Callable[[str], str]
                         ) -> None:
    """A table of method names, each a table of fields of that method's ``Config``; errors name
    ``where``, or ``method_where(method)`` for a method's table."""
    check_keys(options, set(available_methods()), where)
    for m, table in options.items():
        check_keys(table, {f.name for f in dataclasses.fields(method_class(m).Config)},
                   method_where(m))


def check_keys(table: Any, allowed: set[str], where: str) -> None:
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table, got {type(table).__name__}")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid: {', '.join(sorted(allowed))}")


def row_count(value: Any, where: str) -> int | None:
    """``n_samples``: dataset rows used per domain (>= 1), or ``"all"`` (None)."""
    if value == "all":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{where}: stream.n_samples (dataset rows per domain) must be an int >= 1 or '
                         f'"all", got {value!r}')
    return value
