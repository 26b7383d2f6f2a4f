"""TrainModeBatchNorm2d equals nn.BatchNorm2d in training mode, gradients included."""

from __future__ import annotations

import copy

import pytest
import torch

from dyntta.norm import TestBatchNorm2d, TrainModeBatchNorm2d
from tests.norm.test_layers import source_bn


def test_forward_and_gradients_equal_training_mode_batchnorm_and_running_stats_stay():
    bn = source_bn(5)
    layer = TrainModeBatchNorm2d(bn)
    torch_bn = copy.deepcopy(bn).train()
    x = torch.randn(6, 5, 4, 3, generator=torch.Generator().manual_seed(1)) * 2 + 1
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y, expected = layer(x1), torch_bn(x2)
    torch.testing.assert_close(y, expected)
    target = torch.randn_like(y)
    (y * target).sum().backward()
    (expected * target).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(layer.weight.grad, torch_bn.weight.grad)
    torch.testing.assert_close(layer.bias.grad, torch_bn.bias.grad)
    assert torch.equal(layer.running_mean, bn.running_mean)
    assert torch.equal(layer.running_var, bn.running_var)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), TestBatchNorm2d(bn)(x))


def test_eval_mode_changes_nothing():
    layer = TrainModeBatchNorm2d(source_bn(5))
    x = torch.randn(4, 5, 3, 3)
    assert torch.equal(layer.train()(x), layer.eval()(x))


def test_wrong_channel_count_raises():
    with pytest.raises(ValueError, match=r"expects \(B, 5, H, W\)"):
        TrainModeBatchNorm2d(source_bn(5))(torch.randn(2, 4, 3, 3))


def test_one_value_per_channel_raises_naming_the_cause():
    layer = TrainModeBatchNorm2d(source_bn(5))
    with pytest.raises(ValueError, match="batch of 1 sample on 1x1 maps .* batches of 2 or more"):
        layer(torch.randn(1, 5, 1, 1))
    assert layer(torch.randn(2, 5, 1, 1)).shape == (2, 5, 1, 1)  # two values per channel
    assert layer(torch.randn(1, 5, 2, 1)).shape == (1, 5, 2, 1)
