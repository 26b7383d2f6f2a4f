"""UnMix-TNS as a method: every BN replaced, seeded components, backward-free."""

import pytest
import torch
from torch import nn

import dyntta
from dyntta.methods.unmix_tns import UnMixTNSConfig
from dyntta.norm import UnMixTNS2d
from tests.conftest import random_images, tiny_resnet


def components(method):
    return [m.component_means.clone() for m in method.modules() if isinstance(m, UnMixTNS2d)]


def test_every_bn_is_replaced_with_the_configured_layer(tiny_model):
    method = dyntta.adapt(tiny_model, "unmix_tns", num_components=5, momentum=0.2)
    layers = [m for m in method.model.modules() if isinstance(m, UnMixTNS2d)]
    assert len(layers) == sum(isinstance(m, nn.BatchNorm2d) for m in tiny_model.modules())
    assert all((m.num_components, m.momentum, m.temperature) == (5, 0.2, 0.07) for m in layers)
    assert not any(p.requires_grad for p in method.parameters())


def test_initial_components_depend_on_the_seed_only():
    a = components(dyntta.adapt(tiny_resnet(), "unmix_tns", seed=1))
    b = components(dyntta.adapt(tiny_resnet(), "unmix_tns", seed=1))
    c = components(dyntta.adapt(tiny_resnet(), "unmix_tns", seed=2))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_components_move_with_the_stream_and_outputs_need_no_grad():
    method = dyntta.adapt(tiny_resnet(), "unmix_tns")
    before = components(method)
    out = method(random_images(8))
    assert not out.requires_grad
    assert not all(torch.equal(x, y) for x, y in zip(before, components(method)))
    frozen = dyntta.adapt(tiny_resnet(), "unmix_tns", momentum=0.0)
    x = random_images(8)
    torch.testing.assert_close(frozen(x), frozen(x))


def test_one_component_is_instance_normalisation_throughout_the_model():
    model = tiny_resnet()
    method = dyntta.adapt(model, "unmix_tns", num_components=1)
    reference = tiny_resnet()
    for m in reference.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.track_running_stats = False
            m.running_mean = m.running_var = None
    x = random_images(8)
    # BN without running statistics on one sample at a time is instance normalisation
    expected = torch.cat([reference(x[i : i + 1]) for i in range(len(x))])
    torch.testing.assert_close(method(x), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs", [{"num_components": 0}, {"momentum": -0.5}, {"temperature": 0}, {"init_spread": 1}]
)
def test_bad_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        UnMixTNSConfig(**kwargs)
