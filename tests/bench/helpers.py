"""Benchmark test helpers: a tiny in-memory source (3 corruptions of 40 random images), grid
files, and jobs for the executors."""

from __future__ import annotations

import signal
import textwrap
import time
from pathlib import Path

import numpy as np

from dyntta.bench.sources import Source
from dyntta.data import ArrayCorruptedDataset
from tests.conftest import tiny_resnet

CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise")

# A user's own module of model factories (``usermodels.py``): the tiny ResNet of
# ``tests.conftest.tiny_resnet`` and ways a factory can go wrong.
USER_MODULE = textwrap.dedent("""
    import torch
    from torch import nn

    from dyntta.models import Normalized, ResNet, ResNetSpec


    def tiny(classes=3):
        net = ResNet(ResNetSpec("basic", (1, 1), (4, 8), "B", 4), classes)
        return Normalized(net, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))


    def softmaxed():
        return nn.Sequential(tiny(), nn.Softmax(dim=1))


    def flat():
        return nn.Sequential(tiny(), nn.Flatten(0))


    def two_classes():
        return tiny(classes=2)


    def not_a_module():
        return "a model"


    not_callable = 3
""")



def tiny_source(entry=None, options=None, progress=False, quiet=False) -> Source:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=40)
    arrays = {
        (c, 5): np.clip(rng.normal(60 * (i + 1), 30, size=(40, 8, 8, 3)), 0, 255).astype(np.uint8)
        for i, c in enumerate(CORRUPTIONS)
    }
    return Source("tiny", ArrayCorruptedDataset(arrays, labels, "tiny"), tiny_resnet(), "tiny",
                  checkpoint_sha256="tiny-model")


GRID_TOML = """
title = "tiny grid"
seeds = [0, 1]
methods = ["source", "tbn", "dyn"]
[stream]
scenarios = ["crossmix", "continual"]
batch_sizes = [16]
n_domains = [3]
[[datasets]]
name = "digits"
"""

NPZ_GRID_TOML = """title = "tiny npz"
methods = ["source", "tbn", "dyn"]
[stream]
scenarios = ["crossmix"]
batch_sizes = [8]
n_domains = [3]
[[datasets]]
name = "npz"
path = "clean.npz"
checkpoint = "tiny.pt"
"""
# a grid over clean.npz (corrupted here) and its checkpoint tiny.pt, both beside the grid file


def sigint_as_in_a_terminal() -> None:
    """``preexec_fn`` for a child that the test interrupts with SIGINT: a shell that starts
    pytest in the background leaves SIGINT ignored, and Python keeps an ignored SIGINT; a
    terminal's Ctrl-C reaches a foreground process, whose SIGINT is the default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def slow_on_seed_1(folder: Path, seconds: float, cell) -> dict:
    """A job (bind the first two arguments with functools.partial): a seed-0 cell leaves
    ``folder/fast`` and returns; a seed-1 cell waits for ``fast`` (so the seed-0 cell ends first),
    leaves ``started``, sleeps ``seconds``, then leaves ``ended`` (a cell stopped early leaves no
    ``ended``)."""
    if cell.seed == 1:
        while not (folder / "fast").exists():
            time.sleep(0.05)
        (folder / "started").touch()
        time.sleep(seconds)
        (folder / "ended").touch()
    else:
        (folder / "fast").touch()
    return {"key": cell.key}


def to_the_time_limit(folder: Path, cell) -> dict:
    """A Slurm job (bind the first argument with functools.partial) that sleeps 10 minutes: a
    seed-1 cell as it is (submitit acts on the time-limit warning), a seed-0 cell with the warning
    signal at its default action, as a job still loading its cell when the warning comes. A cell
    stopped early leaves no ``folder/ended``."""
    if cell.seed == 0:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    time.sleep(600)
    (folder / "ended").touch()
    return {"key": cell.key}
