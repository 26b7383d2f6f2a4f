"""The project's documents speak of the project, not of how it was written: no work sessions,
no issue numbers, no commit hashes in the README, the results and benchmarks documents, docs/,
src/, benchmarks/, configs/ and tests/ (each benchmark record carries its code's git revision
instead)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

HISTORY = {
    "a work session": re.compile(r"\bsessions?\b", re.I),
    "a work period": re.compile(r"\bwork periods?\b", re.I),
    "an issue number": re.compile(r"\bissues?\s+(?:#\s*)?\d+", re.I),
    "an issue number (#N)": re.compile(r"(?<![\w&/#])#\d+\b"),
    "the issue tracker's wording": re.compile(r"\bthe issue(?:'s)?\b", re.I),
    # an abbreviated (7-12) or full (40) commit hash standing alone; longer digests (sha256),
    # MD5s (32) and hub file names (resnet18-f37072fd.pth) are not commit-like
    "a commit hash": re.compile(
        r"(?<![\w\-./])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])(?:[0-9a-f]{7,12}|[0-9a-f]{40})(?![\w\-])"),
}

SUFFIXES = {".py", ".md", ".toml", ".csv", ".txt", ".yml", ".yaml"}


def documents() -> list[Path]:
    files = [REPO / "README.md", REPO / "RESULTS.md", REPO / "BENCHMARKS.md", REPO / "mkdocs.yml"]
    for folder in ("docs", "src", "benchmarks", "configs", "tests"):
        files += sorted(p for p in (REPO / folder).rglob("*") if p.suffix in SUFFIXES)
    return [f for f in files if f.is_file() and f != Path(__file__).resolve()]


def findings(text: str) -> list[str]:
    """``kind: excerpt`` for every trace of the work history in ``text``."""
    found = []
    for kind, pattern in HISTORY.items():
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"line {line}: {kind}: {m.group(0)!r}")
    return found


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_documents_carry_no_work_history(path):
    text = path.read_text(encoding="utf-8")
    assert findings(text) == []


@pytest.mark.parametrize("text, kind", [
    ("measured in the eleventh session", "a work session"),
    ("Sessions ran it", "a work session"),
    ("beyond the paper (issue 12)", "an issue number"),
    ("issues 4 and 5", "an issue number"),
    ("see #12", "an issue number (#N)"),
    ("all cells of the issue's grid", "the issue tracker's wording"),
    ("at commit 80c08dd, idle", "a commit hash"),
    ("defaults (`3ccef83`)", "a commit hash"),
    ("at 0280ccb.", "a commit hash"),
    ("the tree at " + "a1b2c3d4" * 5, "a commit hash"),
    ("measured at 20a4395 and revision `daf190c`", "a commit hash"),
])
def test_each_kind_of_trace_is_found(text, kind):
    assert [f for f in findings(text) if f": {kind}: " in f]


@pytest.mark.parametrize("text", [
    "sha256 `302329d116ece3a0bc803fbffbffc85d9d649f19522c12b4776a974fd6b00c42`",
    "md5 56bf5dcef84df0e2308c6dcbcbbd8499",
    "`resnet18-f37072fd.pth`, `resnet20-12fca82f.th`",
    "the frost photographs of 20190305, 1e-5, 0x7fffffff, a decade, effaced",
    "Discover Your Neighbours [#dyn-paper](#source-models) and &#12;",
    "an issue of scale; issues with label shift",
])
def test_legitimate_text_passes(text):
    assert findings(text) == []
