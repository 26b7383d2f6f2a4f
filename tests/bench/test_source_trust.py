"""The synthetic agreement of ``benchmarks/oracle_partition.py``: the synthetic shifts are
those named, and the agreement is the model's own predictions with and without them."""

from __future__ import annotations

import torch

from benchmarks.oracle_partition import (BATCH, DRAWS, SYNTHETIC, synthetic_agreement,
                                         synthetic_shift)
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
    """Weight 1 ignores the clusters: the share is how often the source model predicts the
    shifted images as the unshifted ones, shifts drawn as the reading draws them; images beyond
    the last whole batch are not read."""
    model, x = tiny_resnet(), random_images(BATCH + 9, seed=4)
    shares = synthetic_agreement(model, x, [0.0, 1.0], seed=7)
    generator = torch.Generator().manual_seed(7)
    kinds = [torch.randperm(BATCH, generator=generator) % 5 for _ in range(DRAWS)]
    shifted = [synthetic_shift(x[:BATCH], kind, generator) for kind in kinds]
    with torch.no_grad():
        reference = model(x[:BATCH]).argmax(1)
        alike = sum(int((model(s).argmax(1) == reference).sum()) for s in shifted)
    assert shares[1] == alike / (BATCH * DRAWS)
    assert shares[0] != shares[1]  # at weight 0 the batch statistics answer instead
