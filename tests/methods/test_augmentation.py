"""CoTTA's strong augmentation (used by RoTTA and ViDA), operation by operation."""

import colorsys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

import dyntta
from dyntta.methods.augmentation import (
    StrongAugmentation,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    affine,
    center_crop,
    gaussian_blur,
    hsv_to_rgb,
    rgb_to_hsv,
)
from tests.conftest import random_images


def test_same_seed_same_output_and_the_range_is_kept():
    x = random_images(4)
    a, b = StrongAugmentation(seed=1), StrongAugmentation(seed=1)
    first = a(x)
    assert torch.equal(first, b(x))
    assert first.shape == x.shape
    assert first.min() >= 0 and first.max() <= 1
    assert not torch.equal(first, StrongAugmentation(seed=2)(x))
    assert not torch.equal(a(x), first)  # a new draw per call


def test_input_neither_rgb_nor_grayscale_is_rejected():
    with pytest.raises(ValueError, match="RGB or grayscale"):
        StrongAugmentation()(torch.rand(2, 4, 8, 8))


def test_grayscale_images_take_torchvisions_grayscale_operations():
    """The image is its own grey (contrast blends with its mean); saturation and hue leave it."""
    x = random_images(4)[:, :1]
    assert torch.equal(adjust_saturation(x, 1.5), x) and torch.equal(adjust_hue(x, 0.06), x)
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    torch.testing.assert_close(adjust_contrast(x, 0.7), (0.7 * x + 0.3 * mean).clamp(0, 1))
    out = StrongAugmentation(seed=1)(x)
    assert out.shape == x.shape and torch.equal(out, StrongAugmentation(seed=1)(x))
    assert 0 <= out.min() and out.max() <= 1 and not torch.equal(out, x)


@pytest.mark.parametrize("method", ["rotta", "vida"])
def test_the_augmenting_methods_adapt_a_grayscale_model(method):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
                                torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(4, 3)).eval()
    adapted = dyntta.adapt(model, method)
    for seed in range(10):  # RoTTA augments once it has seen 64 samples
        assert torch.isfinite(adapted(random_images(8, seed=seed)[:, :1])).all()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_hsv_matches_colorsys_and_round_trips(seed):
    x = random_images(1, seed, 2, 3)
    h, s, v = rgb_to_hsv(x)
    for i in range(2):
        for j in range(3):
            ref = colorsys.rgb_to_hsv(*x[0, :, i, j].tolist())
            got = (h[0, i, j].item(), s[0, i, j].item(), v[0, i, j].item())
            assert got == pytest.approx(ref, abs=1e-5)
    torch.testing.assert_close(hsv_to_rgb(h, s, v), x, atol=1e-5, rtol=0)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.floats(-0.5, 0.5))
def test_hue_rotation_matches_colorsys(seed, shift):
    x = random_images(1, seed, 2)
    out = adjust_hue(x, shift)
    for i in range(2):
        for j in range(2):
            h, s, v = colorsys.rgb_to_hsv(*x[0, :, i, j].tolist())
            ref = colorsys.hsv_to_rgb((h + shift) % 1.0, s, v)
            assert out[0, :, i, j].tolist() == pytest.approx(ref, abs=1e-5)


def test_colour_operations_at_their_neutral_and_extreme_factors():
    x = random_images(4)
    torch.testing.assert_close(adjust_brightness(x, 1.0), x)
    torch.testing.assert_close(adjust_contrast(x, 1.0), x)
    torch.testing.assert_close(adjust_saturation(x, 1.0), x)
    grey = 0.2989 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]
    torch.testing.assert_close(adjust_saturation(x, 0.0), grey.unsqueeze(1).expand_as(x))
    flat = adjust_contrast(x, 0.0)
    torch.testing.assert_close(flat, grey.mean(dim=(1, 2)).view(-1, 1, 1, 1).expand_as(x))
    torch.testing.assert_close(adjust_brightness(x, 0.5), x * 0.5)


def test_affine_identity_and_integer_shift():
    x = random_images(2, 0, 6, 7)
    torch.testing.assert_close(affine(x, 0.0, (0, 0), 1.0), x, atol=1e-6, rtol=0)
    shifted = affine(x, 0.0, (2, -1), 1.0)  # content moves 2 right and 1 up
    expected = torch.zeros_like(x)
    expected[..., :-1, 2:] = x[..., 1:, :-2]
    torch.testing.assert_close(shifted, expected, atol=1e-6, rtol=0)


def test_affine_quarter_turn_moves_pixels_by_index_arithmetic():
    x = random_images(1, 0, 5)
    out = affine(x, 90.0, (0, 0), 1.0)
    expected = torch.empty_like(x)
    for i in range(5):
        for j in range(5):
            # output offset (u, v) from the centre samples the input at (v, -u)
            u, v = j - 2, i - 2
            expected[..., i, j] = x[..., 2 - u, 2 + v]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_blur_matches_a_direct_two_dimensional_convolution():
    x = random_images(2, 0, 9)
    sigma = 0.7
    t = torch.arange(5, dtype=torch.float32) - 2
    k1 = torch.exp(-0.5 * (t / sigma) ** 2)
    k2 = torch.outer(k1, k1) / k1.sum() ** 2
    padded = F.pad(x, (2, 2, 2, 2), mode="reflect")
    expected = F.conv2d(padded, k2.expand(3, 1, 5, 5), groups=3)
    torch.testing.assert_close(gaussian_blur(x, 5, sigma), expected)
    torch.testing.assert_close(gaussian_blur(x, 5, 1e-3), x)


def test_center_crop_takes_the_middle():
    x = torch.arange(2 * 3 * 6 * 8, dtype=torch.float32).reshape(2, 3, 6, 8)
    assert torch.equal(center_crop(x, 2, 4), x[..., 2:4, 2:6])
