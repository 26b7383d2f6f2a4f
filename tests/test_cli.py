"""The `dyntta` command's own behaviour (sub-commands are tested with their packages)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dyntta
from dyntta.cli import main, os_error_message


def test_methods_lists_every_registered_method_with_options(capsys):
    assert main(["methods", "-v"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines() if not line.startswith(" ")]
    assert listed == dyntta.available_methods()
    assert "alpha = 0.8" in out


def test_version_and_unknown_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert dyntta.__version__ in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_methods_and_help_read_as_plain_text_through_the_command():
    """No reST roles or literals (``:class:`~...```), lines wrapped at 100 columns; NOTE says it
    predicts each sample on its own; ``bench --help`` names the datasets, not a source file."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    run = [sys.executable, "-m", "dyntta.cli"]
    methods = subprocess.run([*run, "methods"], capture_output=True, text=True, env=env,
                             check=True).stdout
    assert ":class:" not in methods and "`" not in methods
    assert "unmix_tns    Every BN layer becomes an UnMixTNS2d layer." in methods
    assert max(len(line) for line in methods.splitlines()) <= 100
    note = " ".join(methods[methods.index("\nnote "):methods.index("\nrotta ")].split())
    assert "Predicts each sample on its own" in note and "immune to mixed batches" in note
    help_text = " ".join(subprocess.run([*run, "bench", "--help"], capture_output=True,
                                        text=True, env=env, check=True).stdout.split())
    assert "sources.py" not in help_text
    assert "(digits, cifar10-c, cifar100-c, imagenet-c, npz)" in help_text


def test_os_errors_are_one_line_naming_the_path():
    exc = PermissionError(errno.EACCES, "Permission denied", "/data/out")
    assert os_error_message(exc) == ("/data/out: no permission; choose a writable location "
                                     "(e.g. another --out or --cache-dir)")
    assert os_error_message(OSError(errno.EIO, "Input/output error", "f")) == "f: Input/output error"
    assert os_error_message(FileNotFoundError("grid file not found: g.toml")) == \
        "grid file not found: g.toml"
