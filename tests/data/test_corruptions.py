"""The 15 corruptions: shape, dtype, change, strength over severities, determinism, parameters."""

from __future__ import annotations

import colorsys
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import ndimage

from dyntta.data import CORRUPTIONS, corrupt
from dyntta.data.corruptions import (
    FROST_RESIZE, PARAMS, RECIPES, frost_scale, recipe_for)
from dyntta.data.frost import load_textures
from dyntta.data.frost import FILES, FROST_SHAPES, FROST_STATS, procedural_texture
from tests.conftest import SHARED_DATA

RANDOM = {"gaussian_noise", "shot_noise", "impulse_noise", "glass_blur", "motion_blur", "snow",
          "frost", "fog", "elastic_transform"}
MONOTONE = sorted(set(CORRUPTIONS) - {"glass_blur", "frost", "elastic_transform"})


def smooth_images(n: int, size: int, seed: int = 0) -> np.ndarray:
    """Smooth colour images with mild noise, values within 30..220 (no clipping at rest)."""
    rng = np.random.default_rng(seed)
    x = ndimage.gaussian_filter(rng.random((n, size, size, 3)), (0, size / 10, size / 10, 0))
    x = (x - x.min(axis=(1, 2, 3), keepdims=True)) / np.ptp(x, axis=(1, 2, 3), keepdims=True)
    return np.clip(30 + 190 * x + rng.normal(0, 8, x.shape), 0, 255).astype(np.uint8)


def distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(float) - b.astype(float)).mean())


@pytest.fixture(scope="module")
def images():
    return smooth_images(12, 32)


@pytest.fixture(scope="module")
def by_severity(images):
    return {name: [corrupt(images, name, s, seed=0) for s in range(1, 6)] for name in CORRUPTIONS}


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_keeps_shape_and_dtype_and_changes_the_image(images, by_severity, name):
    for out in by_severity[name]:
        assert out.shape == images.shape and out.dtype == np.uint8
        assert distance(out, images) > 0.5


@pytest.mark.parametrize("name", MONOTONE)
def test_pixel_distance_grows_with_severity(images, by_severity, name):
    d = [distance(out, images) for out in by_severity[name]]
    # motion blur 3 -> 4 only widens a kernel whose extra taps weigh < 0.3 %: allow a near tie
    assert all(b >= a - 0.05 for a, b in zip(d, d[1:])), d
    assert d[-1] > d[0] + 0.5, d


def test_glass_blur_two_shuffling_passes_are_stronger_than_one(images, by_severity):
    d = [distance(out, images) for out in by_severity["glass_blur"]]
    assert min(d[3:]) > max(d[:3]), d  # severities 4, 5 shuffle twice, 1..3 once


def test_frost_decorrelates_more_with_severity(images, by_severity):
    def decorrelation(out):
        a = out.reshape(len(out), -1).astype(float)
        b = images.reshape(len(images), -1).astype(float)
        a, b = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
        return 1 - np.mean((a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1)))

    d = [decorrelation(out) for out in by_severity["frost"]]
    assert all(b > a for a, b in zip(d, d[1:])), d


def test_elastic_non_affine_displacement_grows_with_severity():
    """Warping a coordinate ramp reveals the displacement field; its non-affine part grows with
    severity while the random affine part shrinks, as the recipe's parameters say."""
    n, size, lo, hi = 8, 32, 8, 24
    rows, cols = np.mgrid[0:size, 0:size]
    ramp = np.zeros((n, size, size, 3), np.uint8)
    ramp[..., 0], ramp[..., 1] = 8 * rows, 8 * cols
    design = np.stack([rows[lo:hi, lo:hi].ravel(), cols[lo:hi, lo:hi].ravel(), np.ones((hi - lo) ** 2)], 1)
    residual, affine = [], []
    for severity in range(1, 6):
        out = corrupt(ramp, "elastic_transform", severity, seed=1).astype(float) / 8
        res, aff = [], []
        for i in range(n):
            for ch, grid in ((0, rows), (1, cols)):
                source = out[i, lo:hi, lo:hi, ch].ravel()
                fit = design @ np.linalg.lstsq(design, source, rcond=None)[0]
                res.append(np.sqrt(np.mean((source - fit) ** 2)))
                aff.append(np.abs(fit - grid[lo:hi, lo:hi].ravel()).mean())
        residual.append(np.mean(res))
        affine.append(np.mean(aff))
    assert all(b >= a - 0.01 for a, b in zip(residual, residual[1:])), residual
    assert residual[-1] > residual[0] + 0.3, residual
    assert affine[0] > affine[-1], affine


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_deterministic_given_a_seed(images, by_severity, name):
    again = corrupt(images, name, 3, seed=0)
    assert np.array_equal(again, by_severity[name][2])
    other = corrupt(images, name, 3, seed=1)
    assert np.array_equal(other, again) == (name not in RANDOM)


def test_parameters_of_the_published_tables():
    """A few entries of make_cifar_c.py / make_imagenet_c.py, typed here from the source."""
    assert PARAMS["cifar"]["gaussian_noise"] == (0.04, 0.06, 0.08, 0.09, 0.10)
    assert PARAMS["imagenet"]["shot_noise"] == (60, 25, 12, 5, 3)
    assert PARAMS["cifar"]["contrast"] == (0.75, 0.5, 0.4, 0.3, 0.15)
    assert PARAMS["imagenet"]["jpeg_compression"] == (25, 18, 15, 10, 7)
    assert PARAMS["cifar"]["snow"][4] == (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)
    # np.arange(1, 1.06, 0.01) in the recipe reaches 1.06 through rounding: 7 zoom factors
    np.testing.assert_allclose(PARAMS["cifar"]["zoom_blur"][0], [1, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06])
    np.testing.assert_allclose(PARAMS["imagenet"]["zoom_blur"][4], 1 + 0.03 * np.arange(11))
    np.testing.assert_allclose(PARAMS["imagenet"]["elastic_transform"][0], (488, 170.8, 24.4))
    for recipe in PARAMS.values():
        assert set(recipe) == set(CORRUPTIONS) and all(len(v) == 5 for v in recipe.values())


def test_gaussian_noise_has_the_recipe_standard_deviation():
    grey = np.full((4, 32, 32, 3), 128, np.uint8)
    for severity, c in enumerate((0.04, 0.06, 0.08, 0.09, 0.10), start=1):
        noise = corrupt(grey, "gaussian_noise", severity, seed=severity).astype(float) - 128
        assert noise.std() / 255 == pytest.approx(c, rel=0.05)


def test_shot_noise_has_poisson_variance():
    grey = np.full((4, 32, 32, 3), 128, np.uint8)
    out = corrupt(grey, "shot_noise", 5, seed=0).astype(float) / 255  # c = 50 photons at 1.0
    assert out.var() == pytest.approx((128 / 255) / 50, rel=0.1)


def test_contrast_is_the_recipe_formula(images):
    x = images / 255.0
    means = x.mean(axis=(1, 2), keepdims=True)
    expected = (np.clip((x - means) * 0.4 + means, 0, 1) * 255).astype(np.uint8)
    assert np.array_equal(corrupt(images, "contrast", 3, seed=0), expected)


def test_brightness_adds_to_the_hsv_value(images):
    out = corrupt(images[:2], "brightness", 2, seed=0)  # CIFAR c = 0.1
    for pixel, got in zip(images[:2].reshape(-1, 3) / 255.0, out.reshape(-1, 3)):
        h, s, v = colorsys.rgb_to_hsv(*pixel)
        expected = np.array(colorsys.hsv_to_rgb(h, s, min(v + 0.1, 1.0)))
        assert np.abs(got.astype(int) - (expected * 255).astype(int)).max() <= 1


def test_impulse_noise_flips_the_expected_fraction_to_black_or_white():
    grey = np.full((8, 32, 32, 3), 128, np.uint8)
    out = corrupt(grey, "impulse_noise", 5, seed=0)  # CIFAR amount 0.07
    changed = out != 128
    assert set(np.unique(out[changed]).tolist()) <= {0, 255}
    assert changed.mean() == pytest.approx(0.07, abs=0.01)
    assert (out == 255).sum() == pytest.approx((out == 0).sum(), rel=0.15)


def test_imagenet_recipe_on_224_images():
    x = smooth_images(1, 224, seed=3)
    for name in CORRUPTIONS:
        severity = 1 if name == "glass_blur" else 5  # glass blur at 224 loops over 46k pixels
        out = corrupt(x, name, severity, seed=0)
        assert out.shape == x.shape and out.dtype == np.uint8 and distance(out, x) > 0.5, name
    # the ImageNet recipe is stronger than the CIFAR one at the same severity
    strong = corrupt(x, "gaussian_noise", 5, seed=0)
    weak = corrupt(x, "gaussian_noise", 5, seed=0, recipe="cifar")
    assert distance(strong, x) > 2 * distance(weak, x)


def test_recipe_chosen_by_size_and_explicit_for_other_sizes():
    assert recipe_for(32, 32) == "cifar" and recipe_for(224, 224) == "imagenet"
    x = smooth_images(2, 48)
    with pytest.raises(ValueError, match="48x48"):
        corrupt(x, "fog", 1)
    for name in CORRUPTIONS:
        assert corrupt(x, name, 2, seed=0, recipe="cifar").shape == x.shape


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("size", [(48, 48), (64, 48), (62, 111), (63, 40), (100, 100), (400, 400),
                                  (320, 60), (30, 600)])
def test_frost_textures_cover_the_images_at_the_recipes_scale_or_the_least_larger(recipe, size):
    own = load_textures("procedural", FROST_RESIZE[recipe])
    scale = frost_scale(*size, recipe)
    photos = load_textures("procedural", scale)
    assert all(p.shape[0] > size[0] and p.shape[1] > size[1] for p in photos)
    if all(p.shape[0] > size[0] and p.shape[1] > size[1] for p in own):
        assert scale == FROST_RESIZE[recipe]
    else:  # the least: some texture is one row or one column larger than the images
        assert scale > FROST_RESIZE[recipe]
        assert any(p.shape[0] == size[0] + 1 or p.shape[1] == size[1] + 1 for p in photos)
    x = np.full((2, *size, 3), 128, np.uint8)
    out = corrupt(x, "frost", 5, seed=0, recipe=recipe)
    assert out.shape == x.shape and (out != x).any()


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((np.zeros((2, 32, 32, 3), np.float32), "fog", 1), {}, "uint8"),
        ((np.zeros((32, 32, 3), np.uint8), "fog", 1), {}, "shape"),
        ((np.zeros((0, 32, 32, 3), np.uint8), "fog", 1), {}, "non-empty"),
        ((np.zeros((1, 32, 32, 3), np.uint8), "rain", 1), {}, "rain"),
        ((np.zeros((1, 32, 32, 3), np.uint8), "fog", 6), {}, "severity"),
        ((np.zeros((1, 32, 32, 3), np.uint8), "fog", True), {}, "severity"),
        ((np.zeros((1, 32, 32, 3), np.uint8), "fog", 1), {"recipe": "tiny"}, "recipe"),
        ((np.zeros((1, 32, 32, 3), np.uint8), "fog", 1), {"frost_textures": "photo"}, "frost"),
    ],
)
def test_bad_arguments_raise(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        corrupt(*args, **kwargs)


def test_procedural_frost_textures_match_the_originals_size_and_colour_statistics():
    for index in (1, 3):
        texture = procedural_texture(index)
        assert texture.shape == (*FROST_SHAPES[index], 3) and texture.dtype == np.uint8
        mean, std = FROST_STATS[index]
        np.testing.assert_allclose(texture.mean(axis=(0, 1)) / 255, mean, atol=0.01)
        np.testing.assert_allclose(texture.std(axis=(0, 1)) / 255, std, atol=0.02)
        assert np.array_equal(texture, procedural_texture(index))


def test_frost_from_imagecorruptions_files_blends_the_texture(tmp_path, monkeypatch):
    """With one-colour texture files standing in for imagecorruptions' photographs, frost must be
    exactly the recipe's clip(c0 * x + c1 * texture)."""
    folder = tmp_path / "imagecorruptions" / "frost"
    folder.mkdir(parents=True)
    (tmp_path / "imagecorruptions" / "__init__.py").write_text("raise ImportError('never imported')\n")
    colour = np.array([200, 180, 160], np.uint8)
    for name in FILES:
        Image.fromarray(np.broadcast_to(colour, (300, 400, 3)).copy()).save(folder / name.replace(".jpg", ".png"))
        (folder / name).write_bytes((folder / name.replace(".jpg", ".png")).read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "imagecorruptions", raising=False)
    x = smooth_images(3, 32)
    out = corrupt(x, "frost", 4, seed=0, frost_textures="imagecorruptions")  # c = (0.85, 0.4)
    expected = np.clip(0.85 * x.astype(float) + 0.4 * colour.astype(float), 0, 255).astype(np.uint8)
    assert np.abs(out.astype(int) - expected.astype(int)).max() <= 1


def test_frost_from_imagecorruptions_without_the_package_names_it(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    from dyntta.data import frost

    frost._load_textures.cache_clear()
    with pytest.raises(FileNotFoundError, match="imagecorruptions"):
        corrupt(smooth_images(1, 32), "frost", 1, frost_textures="imagecorruptions")


@pytest.mark.skipif(not (SHARED_DATA / "resnet20-cifar10.th").is_file(), reason="no shared checkpoint")
def test_real_classifier_accuracy_drops_from_severity_1_to_5():
    """On 100 real CIFAR-10 test images, every corruption but glass blur hurts a ResNet-20 more at
    severity 5 than at 1 (published CIFAR-10-C glass blur is about as harmful at every severity)."""
    from dyntta.models import load_checkpoint

    data = np.load(SHARED_DATA / "cifar10-test-jpeg.npz")
    x, y = data["x"][::100], data["y"][::100]  # sorted by class: 10 images per class
    sets = [x] + [corrupt(x, name, s, seed=0) for name in CORRUPTIONS for s in (1, 5)]
    model = load_checkpoint(SHARED_DATA / "resnet20-cifar10.th").eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(np.concatenate(sets)).permute(0, 3, 1, 2).float() / 255)
    correct = (logits.argmax(1).numpy() == np.tile(y, len(sets))).reshape(len(sets), -1)
    clean, accuracy = correct[0].mean(), correct[1:].mean(axis=1).reshape(len(CORRUPTIONS), 2)
    for name, (mild, severe) in zip(CORRUPTIONS, accuracy):
        assert severe <= clean, name
        if name != "glass_blur":
            assert severe < mild, (name, mild, severe)
