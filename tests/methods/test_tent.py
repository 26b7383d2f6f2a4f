"""TENT: one Nesterov-SGD step on the mean entropy, over BN affine parameters only."""

from __future__ import annotations

import torch

import dyntta
from tests.conftest import random_images, tiny_resnet
from tests.methods.gradient_reference import (
    assert_params_equal,
    bn_params,
    entropy,
    grads,
    reference_model,
)


def test_step_equals_nesterov_sgd_on_batch_entropy_and_changes_nothing_else():
    model = tiny_resnet()
    lr = 1e-2
    tent = dyntta.adapt(model, "tent", lr=lr)
    source = {k: v.clone() for k, v in tent.model.state_dict().items()}
    x = random_images(16)
    logits = tent(x)

    ref = reference_model(model)
    params = bn_params(ref)
    ref_logits = ref(x)
    torch.testing.assert_close(logits, ref_logits.detach())  # predicted before the update
    g = grads(entropy(ref_logits).mean(), params)
    # first Nesterov step with momentum 0.9: buffer = g, direction = g + 0.9 * g
    expected = {n: p.detach() - lr * 1.9 * g[n] for n, p in params.items()}
    assert_params_equal(tent, expected, rtol=1e-5, atol=1e-7)

    adapted = {f"{n}" for n in tent.adapted_names}
    for key, value in tent.model.state_dict().items():
        if key not in adapted:  # convolutions, classifier, running statistics: untouched
            assert torch.equal(value, source[key]), key


def test_adapted_parameters_are_exactly_the_bn_affine_ones():
    model = tiny_resnet()
    tent = dyntta.adapt(model, "tent")
    assert set(tent.adapted_names) == set(bn_params(reference_model(model)))
    trainable = {n for n, p in tent.model.named_parameters() if p.requires_grad}
    assert trainable == set(tent.adapted_names)


def test_entropy_decreases_on_a_repeated_batch():
    tent = dyntta.adapt(tiny_resnet(), "tent", lr=5e-2)
    x = random_images(16)
    before = entropy(tent(x)).mean()
    for _ in range(5):
        after = entropy(tent(x)).mean()
    assert after < before - 1e-3


def test_adam_step_equals_the_closed_form_first_adam_step():
    """TENT's CIFAR setting: Adam(lr, betas=(0.9, 0.999)). The first step moves each parameter
    by ``lr * g / (|g| + eps)`` (bias-corrected moments equal g and g^2)."""
    model = tiny_resnet()
    lr = 1e-3
    tent = dyntta.adapt(model, "tent", lr=lr, optimizer="adam", nesterov=False)
    x = random_images(16)
    tent(x)
    ref = reference_model(model)
    params = bn_params(ref)
    g = grads(entropy(ref(x)).mean(), params)
    expected = {n: p.detach() - lr * g[n] / (g[n].abs() + 1e-8) for n, p in params.items()}
    assert_params_equal(tent, expected, rtol=1e-5, atol=1e-7)
