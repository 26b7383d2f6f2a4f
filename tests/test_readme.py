"""The README's Python blocks run as pasted (imports included)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import dyntta
from dyntta.methods import registry
from tests.conftest import random_images, tiny_resnet

REPO = Path(__file__).resolve().parents[1]


def block(heading: str, index: int = 0) -> str:
    """The ``index``-th ```python block of the README section titled ``heading``."""
    section = re.split(r"\n## ", (REPO / "README.md").read_text())
    text = next(s for s in section if s.startswith(heading))
    return re.findall(r"```python\n(.*?)```", text, re.S)[index]


def test_quick_start_runs():
    namespace: dict = {}
    exec(block("Quick start", 0), namespace)
    assert namespace["logits"].shape == (64, 10)


def test_quick_start_with_a_real_checkpoint_runs(shared_data, monkeypatch):
    monkeypatch.chdir(REPO)  # its path is relative to the project root
    namespace: dict = {}
    exec(block("Quick start", 1), namespace)
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
