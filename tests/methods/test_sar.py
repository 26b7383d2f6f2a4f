"""SAR: reliable entropy, the two-step SAM update, model recovery, frozen last stage."""

from __future__ import annotations

import math

import pytest
import torch

import dyntta
from tests.conftest import random_images, tensor_state
from tests.methods.gradient_reference import (
    assert_params_equal,
    bn_params,
    confident_resnet,
    current,
    entropy,
    grads,
    midpoint,
    reference_model,
)

B, C, LR, RHO = 16, 3, 1e-2, 0.05


def test_update_is_the_two_step_sam_update_on_reliable_entropy():
    model = confident_resnet()
    x = random_images(B)
    ref = reference_model(model)
    params = bn_params(ref)
    logits = ref(x)
    e0 = midpoint(entropy(logits), 8)
    reliable = entropy(logits) < e0
    g = grads(entropy(logits)[reliable].mean(), params)
    norm = torch.sqrt(sum(v.square().sum() for v in g.values()))
    perturbed = {n: p.detach() + RHO * g[n] / (norm + 1e-12) for n, p in params.items()}
    ref2 = reference_model(model, perturbed)
    params2 = bn_params(ref2)
    e2 = entropy(ref2(x))
    assert (e2[reliable] - e0).abs().min() > 1e-4  # no sample sits on the threshold
    kept = reliable & (e2 < e0)
    loss2 = e2[kept].mean()
    g2 = grads(loss2, params2)
    expected = {n: p.detach() - LR * g2[n] for n, p in params.items()}  # SGD from theta, not theta'

    sar = dyntta.adapt(model, "sar", lr=LR, rho=RHO, margin=e0 / math.log(C), reset_constant=0.0)
    out = sar(x)
    torch.testing.assert_close(out, logits.detach())
    assert_params_equal(sar, expected, atol=1e-6, rtol=1e-4)
    assert sar.ema == pytest.approx(float(loss2.detach()), rel=1e-5)
    # the plain gradient step would have gone elsewhere: the ascent step matters
    plain = {n: p.detach() - LR * g[n] for n, p in params.items()}
    assert any(not torch.allclose(plain[n], v, atol=1e-5) for n, v in current(sar).items())


def test_recovers_the_source_model_when_the_loss_average_drops_below_the_threshold():
    model = confident_resnet()
    sar = dyntta.adapt(model, "sar", lr=LR, reset_constant=10.0)  # any loss is below 10
    source = {k: v.clone() for k, v in tensor_state(sar).items()}
    out = sar(random_images(B))
    torch.testing.assert_close(out, reference_model(model)(random_images(B)).detach())
    assert sar.num_recoveries == 1 and sar.ema is None
    assert sar.optimizer.state_dict()["state"] == {}
    for key, value in tensor_state(sar).items():
        assert torch.equal(value, source[key]), key


def test_without_recovery_the_moving_average_follows_the_loss():
    sar = dyntta.adapt(confident_resnet(), "sar", lr=LR, reset_constant=0.0)
    source = current(sar)
    values = []
    for i in range(3):
        sar(random_images(B, i))
        values.append(sar.ema)
    assert sar.num_recoveries == 0
    assert any(not torch.equal(v, source[n]) for n, v in current(sar).items())
    # ema_1 = L_1, ema_t = 0.9 ema_{t-1} + 0.1 L_t: the L_t recovered from the sequence are
    # entropies of kept samples, so they lie in (0, margin * ln C)
    losses = [values[0]] + [(values[t] - 0.9 * values[t - 1]) / 0.1 for t in (1, 2)]
    assert all(0 < v < 0.4 * math.log(C) for v in losses)


def test_frozen_stage_keeps_its_parameters():
    sar = dyntta.adapt(confident_resnet(), "sar", lr=LR, frozen=("layer2",), reset_constant=0.0)
    assert sar.adapted_names and not any(".layer2." in n for n in sar.adapted_names)
    frozen = {n: p.clone() for n, p in sar.model.named_parameters() if ".layer2." in n}
    assert frozen
    sar(random_images(B))
    for name, p in sar.model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name


def test_freezing_every_norm_layer_is_an_error():
    with pytest.raises(ValueError, match="affine"):
        dyntta.adapt(confident_resnet(), "sar", frozen=("net",))
