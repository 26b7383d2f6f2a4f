"""A saved adapted model resumes exactly, and mode switches cannot corrupt an adapted model.

Every registered method, with options that make its state move within a few small batches:
adapt, run some batches, save the state dict (``torch.save``, read back with the default
``weights_only=True``), load it into a fresh ``adapt(...)``: the next logits are equal."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import dyntta
from dyntta.models import Normalized, ResNet
from tests.conftest import TINY_SPEC, randomize_bn, random_images, tiny_resnet

FAST = {  # options under which a method's state moves within a few batches of 12
    "note": {"update_every": 8, "memory_size": 8},
    "rotta": {"update_every": 8, "memory_size": 8},
    "eata": {"fisher_size": 12, "lr": 0.01, "margin": 1.0},
    "deyo": {"margin": 0.99, "plpd_threshold": -1.0, "lr": 0.01},
    "vida": {"lr": 1e-3, "rank_high": 8, "num_augmentations": 2},
    "sar": {"lr": 0.01, "margin": 1.0},
    "tent": {"lr": 0.01},
    "dyn_adaptive": {"window": 8, "shallow_window": 16, "deep_window": 24},
    "datta": {"warmup": 2},
}


def batches(n: int, seed: int = 0) -> list[torch.Tensor]:
    return [random_images(12, seed=seed + i) for i in range(n)]


def saved_and_loaded(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)  # weights_only=True: the saved form holds plain data only


@pytest.mark.parametrize("name", dyntta.available_methods())
def test_a_saved_adapted_model_resumes_exactly(name):
    model, options = tiny_resnet(), FAST.get(name, {})
    adapted = dyntta.adapt(model, name, **options)
    for x in batches(3):
        adapted(x)
    fresh = dyntta.adapt(model, name, **options)
    fresh.load_state_dict(saved_and_loaded(adapted.state_dict()))
    for x in batches(3, seed=10):
        assert torch.equal(fresh(x), adapted(x))


@pytest.mark.parametrize("name", ["note", "rotta", "eata", "sar", "dyn_adaptive"])
def test_without_the_extra_state_the_next_logits_differ(name):
    """The check above can fail: dropping what the extra state carries changes the result."""
    model, options = tiny_resnet(), FAST[name]
    adapted = dyntta.adapt(model, name, **options)
    for x in batches(4):
        adapted(x)
    state = {k: v for k, v in adapted.state_dict().items() if not k.endswith("_extra_state")}
    fresh = dyntta.adapt(model, name, **options)
    fresh.load_state_dict(state, strict=False)
    outputs = [(fresh(x), adapted(x)) for x in batches(3, seed=10)]
    assert any(not torch.equal(a, b) for a, b in outputs)


def test_a_state_dict_of_another_method_is_refused_naming_what_differs():
    note = dyntta.adapt(tiny_resnet(), "note")
    rotta = dyntta.adapt(tiny_resnet(), "rotta")
    with pytest.raises(ValueError, match="saved from another method"):
        rotta.load_state_dict(note.state_dict(), strict=False)


def test_reset_is_the_state_saved_at_construction():
    adapted = dyntta.adapt(tiny_resnet(), "note", **FAST["note"])
    first = [adapted(x) for x in batches(3)]
    adapted.reset()
    assert adapted.memory is None and adapted.seen == 0
    assert all(torch.equal(a, adapted(x)) for a, x in zip(first, batches(3)))


@pytest.mark.parametrize("name", ["tbn", "dyn", "note", "tent"])
def test_train_and_eval_change_no_result(name):
    model, options = tiny_resnet(), FAST.get(name, {})
    switched, plain = dyntta.adapt(model, name, **options), dyntta.adapt(model, name, **options)
    switched.train()
    assert switched.training
    modes = {n: m.training for n, m in plain.named_modules() if n}
    assert {n: m.training for n, m in switched.named_modules() if n} == modes
    for x in batches(3):
        assert torch.equal(switched(x), plain(x))
    switched.eval()
    assert torch.equal(switched(random_images(12, 9)), plain(random_images(12, 9)))


def test_train_refuses_a_mode_that_is_not_a_boolean():
    with pytest.raises(ValueError, match="True or False"):
        dyntta.adapt(tiny_resnet(), "dyn").train("yes")


class WithDropout(nn.Module):
    """A classifier whose head is preceded by dropout (``p`` = 0.5 or an identity)."""

    def __init__(self, net: nn.Module, dropout: nn.Module) -> None:
        super().__init__()
        self.net, self.dropout = net, dropout
        self.head = net.linear
        net.linear = nn.Identity()

    def forward(self, x):
        return self.head(self.dropout(self.net(x)))


def with_head_dropout(dropout: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    net = randomize_bn(ResNet(TINY_SPEC, 3))
    return Normalized(WithDropout(net, dropout), (0.5,) * 3, (0.25,) * 3).eval()


@pytest.mark.parametrize("name", ["note", "rotta"])
def test_the_update_step_leaves_a_users_dropout_in_eval_mode(name):
    """Dropout in eval mode is the identity: with it, adaptation equals adaptation without it."""
    dropout = dyntta.adapt(with_head_dropout(nn.Dropout(0.5)), name, **FAST[name])
    identity = dyntta.adapt(with_head_dropout(nn.Identity()), name, **FAST[name])
    torch.manual_seed(1)
    for x in batches(4):
        assert torch.equal(dropout(x), identity(x))
