"""``import dyntta`` (every CLI start, every worker and Slurm job) stays light: SciPy's signal,
stats and ndimage modules, which take seconds to import, load only where they are used (the
functions that use them are tested with their modules)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("scipy.signal", "scipy.stats", "scipy.ndimage")


def test_the_cli_imports_no_heavy_scipy_module_before_it_needs_one():
    code = ("import sys, dyntta, dyntta.cli; "
            f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout

