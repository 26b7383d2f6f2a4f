"""The stateful methods carry state (weights, teacher, memory, optimiser, random generators):
``reset()`` must bring all of it back to the source state."""

import pytest
import torch

import dyntta
from tests.conftest import tensor_state, tiny_resnet

METHODS = [
    ("note", {"update_every": 8, "memory_size": 8}),
    ("rotta", {"update_every": 8, "memory_size": 8}),
    ("deyo", {"margin": 0.99, "plpd_threshold": -1.0, "lr": 0.01}),
    ("vida", {"lr": 1e-3, "rank_high": 8, "num_augmentations": 2}),
    ("unmix_tns", {}),
]


def stream():
    g = torch.Generator().manual_seed(0)
    return [torch.rand(12, 3, 8, 8, generator=g) for _ in range(3)]


@pytest.mark.parametrize("name, options", METHODS)
def test_reset_restores_the_exact_source_state(name, options):
    model = tiny_resnet()
    user_state = {k: v.clone() for k, v in model.state_dict().items()}
    method = dyntta.adapt(model, name, **options)
    source = {k: v.clone() for k, v in tensor_state(method).items()}
    first = [method(x) for x in stream()]
    assert any(not torch.equal(v, source[k]) for k, v in tensor_state(method).items())
    method.reset()
    state = tensor_state(method)
    assert state.keys() == source.keys()
    assert all(torch.equal(state[k], v) for k, v in source.items())
    optimizer = getattr(method, "optimizer", None)
    assert optimizer is None or optimizer.state_dict()["state"] == {}
    assert getattr(method, "memory", None) is None
    # memory, counters and random generators restart too: the same stream, the same outputs
    for before, after in zip(first, [method(x) for x in stream()]):
        assert torch.equal(before, after)
    assert all(torch.equal(v, user_state[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name, options", METHODS)
def test_outputs_are_finite_logits_and_work_under_inference_mode(name, options):
    method = dyntta.adapt(tiny_resnet(), name, **options)
    with torch.inference_mode():
        for x in stream():
            out = method(x)
            assert out.shape == (12, 3) and torch.isfinite(out).all()
