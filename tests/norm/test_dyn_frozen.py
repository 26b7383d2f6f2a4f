"""``dyn`` stays bit-identical: its outputs on fixed batches equal a frozen copy of the CABN
computation as it stood before the successor's options were added, written here
with torch primitives only."""

from __future__ import annotations

import math

import pytest
import torch

import dyntta
from tests.conftest import random_images, tiny_resnet
from tests.norm.test_layers import mixed_batch, source_bn


def frozen_lisc_ids(mu: torch.Tensor) -> torch.Tensor:
    """LISC component ids as they stood then: cosine first neighbours, pointer jumping."""
    if mu.shape[0] == 1:
        return torch.zeros(1, dtype=torch.long)
    unit = mu / torch.linalg.vector_norm(mu, dim=1, keepdim=True).clamp_min(1e-12)
    sim = unit @ unit.T
    sim = sim + sim.T
    sim.fill_diagonal_(float("-inf"))
    nb = sim.argmax(dim=1)
    p = nb
    for _ in range(max(1, math.ceil(math.log2(nb.shape[0])))):
        p = p.gather(0, p)
    return torch.minimum(p, nb.gather(0, p))


def frozen_cabn(x, bn, alpha=0.8, mix="var"):
    n = x.shape[2] * x.shape[3]
    mean = x.mean(dim=(2, 3))
    sq = torch.linalg.vector_norm(x, dim=(2, 3)).square()
    s2 = torch.addcmul(sq, mean, mean, value=-n).clamp_min(0.0) / (n - 1 if n > 1 else n)
    labels = frozen_lisc_ids(mean.detach())
    same = (labels[:, None] == labels[None, :]).to(mean.dtype)
    avg = same / same.sum(1, keepdim=True)
    cm = avg @ mean
    cv = avg @ (s2 + (mean - cm).square())
    m = torch.lerp(cm, bn.running_mean, alpha)
    if mix == "var":
        v = torch.lerp(cv, bn.running_var, alpha)
    else:
        v = torch.lerp(cv.sqrt(), bn.running_var.sqrt(), alpha).square()
    scale = torch.rsqrt(v + bn.eps) * bn.weight
    shift = torch.addcmul(bn.bias, m, scale, value=-1.0)
    shape = (-1, x.shape[1], 1, 1)
    return (x * scale.reshape(shape)).add_(shift.reshape(shape))


@pytest.mark.parametrize("mix", ["var", "std"])
@pytest.mark.parametrize("b", [1, 5, 12])
def test_dyn_layer_is_bit_identical_to_the_frozen_cabn(mix, b):
    bn = source_bn()
    x = mixed_batch(b=b).float()
    layer = dyntta.norm.ClusterAwareBatchNorm2d(bn, mix=mix)
    with torch.no_grad():
        assert torch.equal(layer(x), frozen_cabn(x, bn, mix=mix))


def test_dyn_method_is_bit_identical_to_frozen_cabn_in_every_layer():
    model = tiny_resnet()
    x = random_images(16, seed=3)
    expected = dyntta.adapt(model, "tbn")  # same network; swap its layers for the frozen CABN
    for name, module in list(expected.model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, dyntta.norm.TestBatchNorm2d):
                frozen = Frozen(child)
                setattr(module, child_name, frozen)
    with torch.no_grad():
        assert torch.equal(dyntta.adapt(model, "dyn")(x), expected(x))


class Frozen(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return frozen_cabn(x, self.layer)
