"""The README's Python blocks run as pasted, anywhere: each in a fresh temporary directory (not
the repository), in a process of its own with only the installed package to import."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dyntta
from dyntta.methods import registry
from tests.conftest import random_images, tiny_resnet

REPO = Path(__file__).resolve().parents[1]


def blocks() -> list[tuple[str, str]]:
    """(section heading, code) of every ```python block of the README, in order."""
    found = []
    for section in re.split(r"\n## ", (REPO / "README.md").read_text()):
        heading = section.split("\n", 1)[0]
        found += [(heading, code) for code in re.findall(r"```python\n(.*?)```", section, re.S)]
    return found


def block(heading: str, index: int = 0) -> str:
    """The ``index``-th ```python block of the README section titled ``heading``."""
    return [code for h, code in blocks() if h.startswith(heading)][index]


def run_pasted(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter in ``cwd``, as a user pasting it into a file would.

    The environment is this one's (where the package is importable), less any entry that points
    into the repository other than the package's own sources, so nothing beside the package can
    be imported from the checkout."""
    package_dir = str(Path(dyntta.__file__).resolve().parents[1])
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in paths if str(Path(p).resolve()) == package_dir
        or not Path(p).resolve().is_relative_to(REPO))
    (cwd / "example.py").write_text(code)
    return subprocess.run([sys.executable, "example.py"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_readme_has_python_blocks():
    headings = [h for h, _ in blocks()]
    assert len(headings) >= 4 and "Quick start" in headings and "Adding a method" in headings


@pytest.mark.parametrize("heading, code", blocks(),
                         ids=[f"{h.split(':')[0]}-{i}" for i, (h, _) in enumerate(blocks())])
def test_every_block_runs_in_a_fresh_directory(heading, code, tmp_path):
    assert not tmp_path.resolve().is_relative_to(REPO)
    done = run_pasted(code, tmp_path)
    assert done.returncode == 0, f"README block in {heading!r} failed:\n{done.stderr[-3000:]}"


def test_quick_start_prints_the_logits_shape(tmp_path):
    done = run_pasted(block("Quick start", 0), tmp_path)
    assert done.stdout.startswith("torch.Size([64, 10]) ") and "'dyn'" in done.stdout


def test_the_checkpoint_example_makes_a_loadable_file_when_there_is_none(tmp_path):
    done = run_pasted(block("Quick start", 1), tmp_path)
    assert done.stdout.strip() == "torch.Size([64, 10])"
    model = dyntta.models.load_checkpoint(tmp_path / "my-resnet20.th")
    assert model.net.spec == dyntta.models.build("resnet20").spec


def test_the_checkpoint_example_uses_a_real_checkpoint_that_is_there(shared_data, tmp_path,
                                                                     monkeypatch):
    (tmp_path / "my-resnet20.th").symlink_to(shared_data / "resnet20-cifar10.th")
    before = (shared_data / "resnet20-cifar10.th").stat().st_mtime_ns
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(block("Quick start", 1), namespace)
    assert (shared_data / "resnet20-cifar10.th").stat().st_mtime_ns == before  # not overwritten
    reference = dyntta.models.load_checkpoint(shared_data / "resnet20-cifar10.th")
    torch.testing.assert_close(namespace["model"].net.state_dict(), reference.net.state_dict())
    assert namespace["logits"].shape == (64, 10) and torch.isfinite(namespace["logits"]).all()


def test_adding_a_method_runs_and_registers_it():
    namespace: dict = {}
    try:
        exec(block("Adding a method"), namespace)
        method = dyntta.adapt(tiny_resnet(), "mine", lr=1e-3)
        x = random_images(4)
        torch.testing.assert_close(method(x), tiny_resnet()(x))
        assert method.config.lr == 1e-3
    finally:
        registry._REGISTRY.pop("mine", None)
    with pytest.raises(ValueError, match="unknown method 'mine'"):
        dyntta.adapt(tiny_resnet(), "mine")
