"""The embedded default's shipped source model: the file the README names, and a fresh
``dyntta train`` run reaching its accuracy (training depends on the thread count, so the model
is shipped rather than trained on the user's machine)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from dyntta.bench.sources import DIGITS_MODEL, file_sha256
from dyntta.bench.train import train_classifier
from dyntta.data.datasets import to_tensor
from dyntta.data import corrupt, load_digits_split
from dyntta.models import load_checkpoint

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "dyntta" / "bench" / DIGITS_MODEL
README = Path(__file__).resolve().parents[2] / "README.md"
SHIFTS = ("brightness", "contrast", "fog", "frost")
"""The corruptions that move the digits model (the others leave it near 98%: RESULTS.md, "The default benchmark")."""


def accuracies(model) -> tuple[float, float]:
    """(clean, mean over SHIFTS at severity 5) accuracy on the digits test split."""
    _, _, x, y = load_digits_split()
    model.eval()
    with torch.no_grad():
        def acc(images):
            return float((model(to_tensor(images)).argmax(1).numpy() == y).mean())
        return acc(x), float(np.mean([acc(corrupt(x, c, 5, seed=0)) for c in SHIFTS]))


def test_readme_states_the_shipped_models_sha256_and_command():
    text = README.read_text()
    stated = re.search(r"digits-resnet20\.pt.*?sha256 `?([0-9a-f]{64})", text, re.S)
    assert stated and stated.group(1) == file_sha256(SHIPPED)
    assert "dyntta train --out src/dyntta/bench/models/digits-resnet20.pt" in text


def test_a_fresh_training_run_reaches_the_shipped_models_accuracy():
    """Same recipe (dyntta train's defaults), this machine's thread count: clean accuracy within
    2 points (9 of 449 images) of the shipped model (fresh runs measured 98.9 and 99.8 against
    the shipped 100.0), and above chance under the four shifts.
    Accuracy under shift is not compared: it is what varies between machines (fresh models
    measured 13.8 and 19.8 against the shipped 20.3), which is why the model is shipped."""
    shipped = accuracies(load_checkpoint(SHIPPED))
    train_x, train_y, _, _ = load_digits_split()
    fresh = accuracies(train_classifier(train_x, train_y, progress=False))
    assert fresh[0] >= shipped[0] - 0.02
    assert fresh[1] > 0.1  # 10 classes
