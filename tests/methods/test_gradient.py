"""What TENT, EATA and SAR share: exact reset, clear errors, grad-mode independence."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import dyntta
from dyntta.methods.gradient import masked_mean
from tests.conftest import random_images, tensor_state
from tests.methods.gradient_reference import confident_resnet

# options under which each method really adapts (and keeps memory) on the tiny model
METHODS = {
    "tent": {"lr": 1e-2},
    "eata": {"lr": 1e-2, "margin": 0.6, "d_margin": 0.5, "fisher_size": 16},
    "sar": {"lr": 1e-2, "reset_constant": 0.0},
}


@pytest.mark.parametrize("name", METHODS)
def test_reset_restores_weights_optimiser_and_memory_exactly(name):
    model = confident_resnet()
    method = dyntta.adapt(model, name, **METHODS[name])
    source = copy.deepcopy(tensor_state(method))
    for i in range(3):
        method(random_images(16, i))
    assert any(not torch.equal(v, source[k]) for k, v in tensor_state(method).items())
    assert method.optimizer.state_dict()["state"]  # momentum buffers exist

    method.reset()
    for key, value in tensor_state(method).items():
        assert torch.equal(value, source[key]), key
    assert method.optimizer.state_dict()["state"] == {}
    fresh = dyntta.adapt(model, name, **METHODS[name])
    for attr in ("mean_probs", "fisher", "ema"):
        assert getattr(method, attr, None) is None
    for i in range(3):  # from now on it behaves exactly like a new instance
        assert torch.equal(method(random_images(16, 10 + i)), fresh(random_images(16, 10 + i)))
    for key, value in tensor_state(method).items():
        assert torch.equal(value, tensor_state(fresh)[key]), key


@pytest.mark.parametrize("name", METHODS)
def test_same_results_under_no_grad_and_inference_mode(name):
    model = confident_resnet()
    plain, no_grad, inference = (dyntta.adapt(model, name, **METHODS[name]) for _ in range(3))
    for i in range(2):
        x = random_images(16, i)
        expected = plain(x)
        with torch.no_grad():
            assert torch.equal(no_grad(x), expected)
        with torch.inference_mode():
            assert torch.equal(inference(x.clone()), expected)


@pytest.mark.parametrize("name", METHODS)
def test_the_user_model_is_never_modified(name):
    model = confident_resnet()
    before = copy.deepcopy(model.state_dict())
    method = dyntta.adapt(model, name, **METHODS[name])
    method(random_images(16, 0))
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not any(p.requires_grad is False for p in model.parameters())


def conv_net(affine: bool) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=affine), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3),
    ).eval()


@pytest.mark.parametrize("name", METHODS)
def test_models_without_bn_affine_parameters_are_refused(name):
    with pytest.raises(ValueError, match="affine=True"):
        dyntta.adapt(conv_net(affine=False), name)
    no_bn = nn.Sequential(nn.Conv2d(3, 3, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    with pytest.raises(ValueError, match="BatchNorm2d"):
        dyntta.adapt(no_bn, name)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize(
    "option, match",
    [
        ({"lr": 0.0}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"optimizer": "rmsprop"}, "optimizer.*'sgd'.*'adam'"),  # config type check or __post_init__
        ({"optimizer": "adam", "nesterov": True}, "nesterov=True is an SGD option"),
    ],
)
def test_bad_optimiser_options_raise(name, option, match):
    with pytest.raises(ValueError, match=match):
        dyntta.adapt(conv_net(affine=True), name, **option)


@pytest.mark.parametrize(
    "name, option, match",
    [
        ("eata", {"margin": 0.0}, "margin"),
        ("eata", {"d_margin": 1.5}, "d_margin"),
        ("eata", {"fisher": "source"}, "fisher"),
        ("eata", {"fisher_size": 0}, "fisher_size"),
        ("sar", {"rho": -0.1}, "rho"),
        ("sar", {"frozen": "layer4"}, "frozen"),
    ],
)
def test_bad_method_options_raise(name, option, match):
    with pytest.raises(ValueError, match=match):
        dyntta.adapt(conv_net(affine=True), name, **option)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12), st.integers(0, 1000))
def test_masked_mean_equals_indexed_mean(mask, seed):
    mask = torch.tensor(mask)
    values = torch.randn(len(mask), 3, generator=torch.Generator().manual_seed(seed))
    got = masked_mean(values, mask)
    if mask.any():
        torch.testing.assert_close(got, values[mask].mean(0))
    else:
        assert torch.equal(got, torch.zeros(3))
    torch.testing.assert_close(masked_mean(values[:, 0], mask), got[0])
