"""``refresh_statistics``: every BN layer's running statistics become the average of the
batches' own over the given images, and nothing else in the model changes."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from dyntta.models import refresh_statistics
from tests.conftest import random_images, tiny_resnet


def test_the_first_layer_holds_the_average_of_its_batches_statistics():
    model, images = tiny_resnet(), random_images(10, seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    first = next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    inputs = []  # the first BN's inputs do not depend on any BN statistics
    hook = first.register_forward_pre_hook(lambda m, args: inputs.append(args[0].clone()))
    with torch.no_grad():
        for start in (0, 4, 8):  # batches of 4, 4 and 2
            model(images[start : start + 4])
    hook.remove()
    momentum = first.momentum
    refresh_statistics(model, images, batch_size=4)
    means = torch.stack([x.mean((0, 2, 3)) for x in inputs]).mean(0)
    variances = torch.stack([x.var((0, 2, 3), unbiased=True) for x in inputs]).mean(0)
    torch.testing.assert_close(first.running_mean, means)
    torch.testing.assert_close(first.running_var, variances)
    assert first.momentum == momentum and not model.training
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.endswith(("running_mean", "running_var", "num_batches_tracked"))
                           for k in changed)


def test_a_refreshed_model_normalises_its_images_to_the_layers_shift():
    """With one batch of all the images, the first BN layer in eval mode maps them to channel
    means equal to its bias: its running mean is theirs."""
    model, images = tiny_resnet(), random_images(6, seed=4)
    refresh_statistics(model, images, batch_size=6)
    first = next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    outputs = []
    hook = first.register_forward_hook(lambda m, args, out: outputs.append(out))
    with torch.no_grad():
        model(images)
    hook.remove()
    torch.testing.assert_close(outputs[0].mean((0, 2, 3)), first.bias, atol=1e-5, rtol=0)


def test_only_the_bn_layers_run_in_training_mode():
    """A dropout layer before a BN layer stays off: its statistics are those without it."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Dropout(0.5), nn.BatchNorm2d(4))
    plain = nn.Sequential(net[0], nn.Identity(), nn.BatchNorm2d(4))
    images = random_images(8, seed=5)
    refresh_statistics(net, images, batch_size=4)
    refresh_statistics(plain, images, batch_size=4)
    torch.testing.assert_close(net[2].running_mean, plain[2].running_mean)
    torch.testing.assert_close(net[2].running_var, plain[2].running_var)
    assert not net.training and not net[1].training


@pytest.mark.parametrize("images, message", [
    (torch.rand(3, 8, 8), "float images (N, C, H, W) with N >= 1"),
    (torch.zeros(0, 3, 8, 8), "float images (N, C, H, W) with N >= 1"),
    (torch.zeros(2, 3, 8, 8, dtype=torch.uint8), "float images (N, C, H, W) with N >= 1"),
    (torch.rand(2, 3, 8, 8) * 255, "values must lie in [0, 1]"),
    (torch.full((2, 3, 8, 8), float("nan")), "NaN or Inf"),
    (np.zeros((2, 8, 8, 3), np.uint8), "images as a torch.Tensor, got ndarray"),
])
def test_bad_images_are_named(images, message):
    model = tiny_resnet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=re.escape(message)):
        refresh_statistics(model, images)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_validate_false_takes_images_on_another_scale():
    """A linear first layer sees 255 times the input: 255 times the mean, 255^2 the variance."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4))
    images = random_images(4, seed=6)
    refresh_statistics(net, images)
    mean, var = net[1].running_mean.clone(), net[1].running_var.clone()
    refresh_statistics(net, images * 255, validate=False)
    torch.testing.assert_close(net[1].running_mean, mean * 255)
    torch.testing.assert_close(net[1].running_var, var * 255**2)


def test_models_without_running_statistics_are_refused():
    with pytest.raises(ValueError, match="no BatchNorm2d layer"):
        refresh_statistics(nn.Sequential(nn.Conv2d(3, 2, 1)), torch.rand(2, 3, 4, 4))
    untracked = nn.Sequential(nn.Conv2d(3, 2, 1), nn.BatchNorm2d(2, track_running_stats=False))
    with pytest.raises(ValueError, match="keeps no running statistics"):
        refresh_statistics(untracked, torch.rand(2, 3, 4, 4))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        refresh_statistics(tiny_resnet(), torch.rand(2, 3, 8, 8), batch_size=0)
