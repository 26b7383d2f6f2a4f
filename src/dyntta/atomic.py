"""Atomic file output: write beside the target, then rename, so an interrupted run never leaves a
half-written file behind."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed to ``path``, on any
    error it is removed. Parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual file mode
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(path: str | os.PathLike) -> None:
    """Raise ``OSError`` unless a file can be written at ``path``: its parent folders are created
    and a temporary file is written and removed there (call it before long work, not after)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        tempfile.TemporaryFile(dir=path.parent).close()
    except OSError as exc:  # name the folder, not the temporary file
        raise type(exc)(exc.errno, exc.strerror, str(path.parent)) from None


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


def write_figure(figure, path: str | os.PathLike, **savefig_options) -> Path:
    """Save a matplotlib figure as PNG at ``path`` atomically; ``savefig_options`` go to
    ``figure.savefig`` (e.g. ``dpi``)."""
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", **savefig_options)
    return Path(path)
