"""The results file: one JSON record per finished cell, appended as cells finish (JSON lines).

A run folder is owned by one process at a time (:func:`run_lock`), and readers keep one record
per cell key, so a cell is never counted twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from dyntta.atomic import write_atomic


def read_results(
    path: str | os.PathLike, check: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """The complete records of a results file, one per cell key ([] if there is no file).

    A line that is not a JSON object (a torn write: an interrupted append, a disk that filled
    up) is skipped with a warning naming it; its cell counts as unfinished and a re-run redoes
    it. A second record of a cell key already read is skipped with a warning (the first wins).
    A file that is not text is a ``ValueError``. With ``check`` (reading for a report), so is a
    record that ``check`` refuses (the message names the line) and a file of which no line is a
    JSON object.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    text = data.decode("utf-8", errors="replace")
    if b"\0" in data or "\ufffd" in text[: text.rfind("\n") + 1]:  # a torn tail may cut a character
        raise ValueError(f"{path}: not a results file (binary, or not UTF-8 text); expected the "
                         "JSON lines dyntta bench writes")
    records, seen, torn = [], set(), []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            record = None
        if not isinstance(record, dict):
            torn.append(number)
            continue
        if check is not None:
            try:
                check(record)
            except ValueError as exc:
                raise ValueError(f"{path}: line {number}: {exc}") from None
        key = record.get("key")
        if key is not None:
            if key in seen:
                warnings.warn(f"{path}: line {number} repeats cell {key}; only its first record "
                              "counts", stacklevel=2)
                continue
            seen.add(key)
        records.append(record)
    if check is not None and torn and not records:
        raise ValueError(f"{path}: not a results file: none of its {len(torn)} line(s) is a "
                         "JSON record of dyntta bench")
    for number in torn[:SHOWN]:
        warnings.warn(f"{path}: line {number} is not a whole JSON record; skipped (a re-run "
                      "of the same command redoes its cell)", stacklevel=2)
    if len(torn) > SHOWN:
        warnings.warn(f"{path}: {len(torn) - SHOWN} more lines are not whole JSON records; "
                      "skipped", stacklevel=2)
    return records


SHOWN = 5
"""Torn lines named one by one in warnings; more are counted in one line."""


def drop_torn_tail(path: str | os.PathLike) -> None:
    """Cut a last line that lacks its newline, so that appends start on a fresh line."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    write_atomic(path, data[: data.rfind(b"\n") + 1])


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one record as a line and flush it to disk."""
    line = json.dumps(record, sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def finished_keys(records: Iterable[dict[str, Any]]) -> set[str]:
    return {r["key"] for r in records if "key" in r}


class RunFolderBusy(RuntimeError):
    """Another process is writing the results file."""


@contextlib.contextmanager
def run_lock(results: str | os.PathLike) -> Iterator[None]:
    """Hold the run folder of ``results`` for this process (an advisory ``flock`` on
    ``<results>.lock``, released when the process ends, even when it is killed).

    Raises :class:`RunFolderBusy` naming the holder's PID when another process holds it.
    """
    lock = Path(f"{results}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise RunFolderBusy(
                f"{results} is being written by process {holder}: wait for it to finish or "
                "give another --out (a re-run of the same command resumes where it stopped)"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
