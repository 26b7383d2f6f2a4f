"""Properties over grid files and results lines: any TOML grid either parses into cells or ends
in one ``ValueError`` line naming the file and the key at fault; any results line either reports
or ends in one ``ValueError`` line naming the file and the line. Never another exception."""

from __future__ import annotations

import json
import math
import warnings

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dyntta.bench.config import STREAM_KEYS, load_grid
from dyntta.bench.report import check_record, table
from dyntta.bench.results import read_results
from tests.test_bad_inputs import result_line

SCALARS = st.one_of(
    st.booleans(), st.integers(-3, 70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "dyn", "tbn", "crossmix", "wild", "npz", "digits", "all", "a.b",
                     "published", "process", "slurm", "cifar10"]),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3),
                   st.dictionaries(st.sampled_from(["name", "path", "backend", "x"]), SCALARS,
                                   max_size=2))
TOP = ["title", "seeds", "methods", "columns", "protocol", "compile", "bogus"]
DATASET = st.dictionaries(st.sampled_from(["name", "path", "checkpoint", "family", "oops"]),
                          st.one_of(SCALARS, st.just("digits")), max_size=3)


def toml_value(value) -> str:
    """``value`` as an inline TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") \
            if math.isinf(value) else repr(value)
    if isinstance(value, (int, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(top: dict, stream: dict, datasets: list[dict], as_table: bool) -> str:
    lines = [f"{k} = {toml_value(v)}" for k, v in top.items()]
    if stream:
        lines += ["[stream]", *(f"{k} = {toml_value(v)}" for k, v in stream.items())]
    for d in datasets[:1] if as_table else datasets:
        lines += ["[datasets]" if as_table else "[[datasets]]",
                  *(f"{k} = {toml_value(v)}" for k, v in d.items())]
    return "\n".join(lines) + "\n"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(top=st.dictionaries(st.sampled_from(TOP), VALUES, max_size=3),
       stream=st.dictionaries(st.sampled_from(sorted(STREAM_KEYS) + ["oops"]), VALUES, max_size=3),
       datasets=st.lists(DATASET, max_size=2), as_table=st.booleans())
def test_any_grid_parses_or_names_the_file_and_key(tmp_path, top, stream, datasets, as_table):
    path = tmp_path / "grid.toml"
    path.write_text(toml_document(top, stream, datasets, as_table))
    keys = [*top, *stream, "datasets", "stream", "name", "path", "checkpoint", "family"]
    try:
        grid = load_grid(path)
    except ValueError as exc:
        message = str(exc)
        assert message.startswith(f"{path}:") and "\n" not in message.strip(), message
        assert any(k in message for k in keys), message
    else:
        assert grid.cells() and all(isinstance(s, int) for s in grid.seeds)
        assert 1 <= grid.severity <= 5 and isinstance(grid.severity, int)


JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(-2, 5),
              st.sampled_from(["dyn", "digits", "crossmix", ""])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["name", "a"]), inner, max_size=2)),
    max_leaves=6)
FIELDS = ["accuracy", "batch_correct", "batch_n", "per_domain", "config", "config__method",
          "config__dataset", "config__seed", "config__batch_size", "config__delta",
          "config__options", "config__scenario"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=2),
       raw=st.one_of(st.none(), st.text(max_size=20), st.binary(max_size=20)))
@example(changes={"config__method": "digits"}, raw=None)  # a method name this version lacks
def test_any_results_line_reports_or_names_the_file_and_line(tmp_path, changes, raw):
    path = tmp_path / "results.jsonl"
    line = result_line(**changes)
    if isinstance(raw, bytes):
        path.write_bytes(line.encode() + raw)
    else:
        path.write_text(line + (raw or ""))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            records = read_results(path, check=check_record)
            markdown, _ = table(records)
    except ValueError as exc:
        message = str(exc)
        assert message.startswith(f"{path}:") and "\n" not in message.strip(), message
    else:
        # a method this version does not know (another version's) keeps its row, by its name
        method = records[0]["config"]["method"]
        assert 0 <= records[0]["accuracy"] <= 1 and f"| {method}" in markdown
