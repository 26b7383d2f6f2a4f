"""``benchmarks/cold_cache.py``: timing the layers' statistics changes no prediction, times every
BN layer once per forward and records the input each ran on."""

from __future__ import annotations

import torch

import dyntta
from benchmarks.cold_cache import LayerClock
from dyntta.norm import SourceNorm2d
from tests.conftest import random_images, tiny_resnet


def test_the_timed_forward_is_the_forward_and_times_every_layer():
    x = random_images(12, seed=1)
    with torch.inference_mode():
        expected = dyntta.adapt(tiny_resnet(), "dyn")(x)
        model = dyntta.adapt(tiny_resnet(), "dyn")
        clock = LayerClock(model)
        clock.forward(x, record=False)
        assert not any(clock.times.values())
        clock.forward(x, record=True)
        assert torch.equal(model(x), expected)
    layers = [m for m in model.modules() if isinstance(m, SourceNorm2d)]
    assert clock.layers == layers and set(clock.inputs) == set(layers)
    assert all(clock.inputs[m].shape[1] == m.num_features for m in layers)
    assert all(len(t) == 1 and t[0] >= 0 for t in clock.times.values())
    assert len(clock.alone(3)) == 3
