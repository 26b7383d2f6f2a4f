"""The source trust reading of ``dyn_adaptive``: the synthetic shifts are those named, the
agreement is the model's own predictions with and without them, the level is the one of most
agreement, and the method hands it to its layers."""

from __future__ import annotations

import pytest
import torch

import dyntta
from dyntta.methods.source_trust import (BATCH, DRAWS, SYNTHETIC, SourceTrust,
                                         synthetic_shift)
from dyntta.norm.adaptive import NeighbourhoodNorm2d, PooledNorm2d
from tests.conftest import random_images, tiny_resnet


def test_each_synthetic_shift_is_the_one_named():
    torch.manual_seed(2)
    x = torch.rand(5, 3, 8, 8) * 0.6 + 0.2
    shifted = synthetic_shift(x, torch.arange(5), torch.Generator().manual_seed(0))
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))[1]
    mean = x[3].mean()
    assert SYNTHETIC == ("none", "noise", "blur", "contrast", "brightness")
    assert torch.equal(shifted[0], x[0])
    torch.testing.assert_close(shifted[1], (x[1] + 0.1 * noise).clamp(0, 1))
    interior = sum(x[2, :, i:i + 6, j:j + 6] for i in range(3) for j in range(3)) / 9
    torch.testing.assert_close(shifted[2, :, 1:-1, 1:-1], interior)
    torch.testing.assert_close(shifted[2, :, 0, 0], (4 * x[2, :, 0, 0] + 2 * x[2, :, 0, 1]
                                                     + 2 * x[2, :, 1, 0] + x[2, :, 1, 1]) / 9)
    torch.testing.assert_close(shifted[3], (x[3] - mean) * 0.4 + mean)
    torch.testing.assert_close(shifted[4], (x[4] + 0.3).clamp(max=1))


def test_at_source_weight_one_the_agreement_is_the_source_models():
    """Weight 1 ignores the clusters: the count is how often the source model predicts the
    shifted images as the unshifted ones, shifts drawn as the reading draws them."""
    model, x = tiny_resnet(), random_images(BATCH, seed=4)
    trust = SourceTrust(model, 1.0, (0.0, 1.0), BATCH, seed=7)
    trust.observe(x)
    generator = torch.Generator().manual_seed(7)
    kinds = [torch.randperm(BATCH, generator=generator) % 5 for _ in range(DRAWS)]
    shifted = [synthetic_shift(x, kind, generator) for kind in kinds]
    with torch.no_grad():
        reference = model(x).argmax(1)
        alike = sum(int((model(s).argmax(1) == reference).sum()) for s in shifted)
    assert trust.read == BATCH and trust.agreement[1] == alike
    assert trust.agreement[0] != alike  # at weight 0 the batch statistics answer instead


def test_the_level_is_the_highest_of_most_agreement():
    trust = SourceTrust(tiny_resnet(), 0.6, (0.0, 0.5, 1.0), BATCH)
    assert trust.level == 1.0  # nothing read yet
    for agreement, level in [([5, 9, 7], 0.5), ([9, 9, 7], 0.5), ([9, 7, 9], 1.0),
                             ([9, 3, 2], 0.0)]:
        trust.agreement = torch.tensor(agreement, dtype=torch.float64)
        assert trust.level == level


def test_small_batches_wait_for_a_synthetic_batch_and_reading_stops_at_its_images():
    trust = SourceTrust(tiny_resnet(), 0.6, (0.0, 1.0), 2 * BATCH + 5)
    assert trust.images == 2 * BATCH  # whole synthetic batches
    x = random_images(3 * BATCH, seed=5)
    for start in range(0, BATCH - 4, 4):
        trust.observe(x[start : start + 4])
    assert trust.read == 0 and len(trust.waiting) == BATCH - 4
    trust.observe(x[BATCH - 4 : BATCH + 8])
    assert trust.read == BATCH and len(trust.waiting) == 8
    trust.observe(x[BATCH + 8 :])
    read, agreement = trust.read, trust.agreement.clone()
    assert read == 2 * BATCH and trust.waiting is None
    trust.observe(x[:BATCH])
    assert trust.read == read and torch.equal(trust.agreement, agreement)
    trust.reset()
    assert trust.read == 0 and not trust.agreement.any() and trust.level == 1.0


def test_dyn_adaptive_scales_every_source_weight_by_the_level():
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive")
    with torch.no_grad():
        method(random_images(8, seed=1))
        method.trust.agreement = torch.tensor([1.0, 5.0, 2.0], dtype=torch.float64)
        deep = float(method.deep_source_weight)
        method(random_images(8, seed=2))
    neighbourhoods = [m for m in method.modules() if isinstance(m, NeighbourhoodNorm2d)]
    pooled = [m for m in method.modules() if isinstance(m, PooledNorm2d)]
    assert neighbourhoods and all(float(m.trust) == 0.5 for m in neighbourhoods)
    assert pooled and all(float(m.source_weight) == pytest.approx(0.5 * deep) for m in pooled)


def test_a_saved_reading_resumes_exactly():
    model, x = tiny_resnet(), random_images(BATCH + 16, seed=3)
    method = dyntta.adapt(model, "dyn_adaptive")
    with torch.no_grad():
        method(x[:40])
        method(x[40:])
        state = method.state_dict()
        fresh = dyntta.adapt(model, "dyn_adaptive")
        fresh.load_state_dict(state)
        assert torch.equal(fresh.trust.agreement, method.trust.agreement)
        assert fresh.trust.read == method.trust.read == BATCH
        y = random_images(8, seed=9)
        assert torch.equal(fresh(y), method(y))
    method.reset()
    assert method.trust.read == 0 and not method.trust.agreement.any()
