"""The source trust reading of ``benchmarks/oracle_partition.py``: the synthetic shifts are
those named, and the agreement is the model's own predictions with and without them."""

from __future__ import annotations

import torch

from benchmarks.oracle_partition import BATCH, DRAWS, SYNTHETIC, SourceTrust, synthetic_shift
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
    assert trust.read == 0 and not trust.agreement.any()
