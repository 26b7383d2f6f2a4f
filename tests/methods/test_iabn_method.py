"""The backward-free ``iabn`` method: NOTE's IABN around the batch statistics in every BN."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import dyntta
from dyntta.norm import InstanceAwareBatchNorm2d
from tests.conftest import random_images, tensor_state, tiny_resnet


class FixedStatsBN(nn.Module):
    """Test reference: normalise with unbiased batch (``per_sample=False``) or instance
    (``per_sample=True``) statistics, then the source affine map."""

    def __init__(self, bn: nn.BatchNorm2d, per_sample: bool) -> None:
        super().__init__()
        self.bn, self.dims = bn, (2, 3) if per_sample else (0, 2, 3)

    def forward(self, x):
        mean = x.mean(self.dims, keepdim=True)
        var = x.var(self.dims, keepdim=True, unbiased=True)
        w, b = self.bn.weight[:, None, None], self.bn.bias[:, None, None]
        return (x - mean) / torch.sqrt(var + self.bn.eps) * w + b


def reference(model, per_sample):
    ref = copy.deepcopy(model)
    for parent in list(ref.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                setattr(parent, name, FixedStatsBN(child, per_sample))
    return ref


def test_every_bn_becomes_iabn_around_the_batch_statistics():
    model = tiny_resnet()
    method = dyntta.adapt(model, "iabn", k=2.5)
    layers = [m for m in method.modules() if isinstance(m, InstanceAwareBatchNorm2d)]
    assert len(layers) == sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert all(m.k == 2.5 and m.reference == "batch" and m.momentum is None for m in layers)
    assert not any(p.requires_grad for p in method.parameters())


@pytest.mark.parametrize("k, per_sample", [(1e4, False), (0.0, True)])
def test_wide_band_is_batch_norm_and_zero_band_is_instance_norm(k, per_sample):
    model = tiny_resnet()
    x = random_images(8)
    expected = reference(model, per_sample)(x)
    torch.testing.assert_close(dyntta.adapt(model, "iabn", k=k)(x), expected, rtol=1e-4, atol=1e-4)


def test_default_band_lies_between_and_keeps_no_state():
    model = tiny_resnet()
    method = dyntta.adapt(model, "iabn")
    source = copy.deepcopy(tensor_state(method))
    x = random_images(8)
    first, second = method(x), method(x)
    assert torch.equal(first, second)  # a function of the batch only
    for key, value in tensor_state(method).items():
        assert torch.equal(value, source[key]), key
    for per_sample in (False, True):
        assert not torch.allclose(first, reference(model, per_sample)(x), atol=1e-3)


def test_bad_options_raise():
    with pytest.raises(ValueError, match="k must be"):
        dyntta.adapt(tiny_resnet(), "iabn", k=-1.0)
    with pytest.raises(ValueError, match="skip_threshold"):
        dyntta.adapt(tiny_resnet(), "iabn", skip_threshold=0)
