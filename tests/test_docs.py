"""The documentation site (docs/ and the API reference from the docstrings) builds with
``mkdocs build --strict``, and a broken reference or link fails that build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def copy_docs(where: Path) -> Path:
    """mkdocs.yml and docs/ copied to ``where``, reading the docstrings of this checkout."""
    config = (REPO / "mkdocs.yml").read_text()
    assert "paths: [src]" in config
    (where / "mkdocs.yml").write_text(config.replace("paths: [src]", f"paths: [{REPO / 'src'}]"))
    shutil.copytree(REPO / "docs", where / "docs")
    return where


def build(project: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(project / "site")], cwd=project, capture_output=True, text=True,
                          timeout=600)
    assert "No module named mkdocs" not in done.stderr, \
        "mkdocs is not installed: pip install -e '.[dev]' (or '.[docs]')"
    return done


def test_the_docs_build_in_strict_mode(tmp_path):
    project = copy_docs(tmp_path)
    done = build(project)
    assert done.returncode == 0, done.stderr[-3000:]
    methods = (project / "site" / "api" / "methods" / "index.html").read_text()
    for anchor in ("dyn.DYNConfig", "dyn_adaptive.DYNAdaptiveConfig", "tent.TentConfig",
                   "note.NOTEConfig"):
        assert f'id="dyntta.methods.{anchor}"' in methods, anchor
    index = (project / "site" / "index.html").read_text()
    assert 'href="api/adapt/#dyntta.methods.registry.adapt"' in index  # a resolved reference


BROKEN = {  # a reference of each kind that resolves nowhere -> what the build's error names
    "[a function that is not there][dyntta.methods.registry.no_such_function]":
        "dyntta.methods.registry.no_such_function",
    "[a page that is not there](no-such-page.md)": "no-such-page.md",
    "[an anchor that is not there](methods.md#no-such-section)": "no-such-section",
}


def test_broken_references_fail_the_strict_build_each_named(tmp_path):
    """One build with a broken reference of each kind: strict mode fails it and names every one
    (a warning each, so each alone would fail it)."""
    project = copy_docs(tmp_path)
    with open(project / "docs" / "index.md", "a") as f:
        f.write("".join(f"\nSee {bad}.\n" for bad in BROKEN))
    done = build(project)
    assert done.returncode != 0, done.stderr[-3000:]
    for named in BROKEN.values():
        assert named in done.stderr, (named, done.stderr[-3000:])
