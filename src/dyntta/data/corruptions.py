"""The 15 standard image corruptions of CIFAR-10-C and ImageNet-C, at severities 1..5.

Parameters and operations follow the published recipes (Hendrycks & Dietterich, ICLR 2019,
"Benchmarking Neural Network Robustness to Common Corruptions and Perturbations"; code:
``ImageNet-C/create_c/make_cifar_c.py`` for 32x32 images and ``make_imagenet_c.py`` for 224x224
images in the public ``robustness`` repository). The code is re-implemented here on NumPy, SciPy
and Pillow (see :mod:`dyntta.data.image_ops`); what differs from the original:

- random numbers come from ``numpy.random.default_rng(seed)``, so outputs are reproducible but
  not bit-identical to the published sets (whose seeds are unknown);
- ``impulse_noise`` follows current scikit-image ``random_noise(mode="s&p")`` (each value flipped
  with probability ``amount``, salt or pepper with probability 1/2);
- ``frost`` needs texture photographs: by default procedurally generated ones
  (:mod:`dyntta.data.frost`); ``frost_textures="imagecorruptions"`` reads the original six files
  shipped by the PyPI package ``imagecorruptions`` (install it with ``--no-deps``);
- ``glass_blur`` keeps the code's behaviour: its "swap" of two RGB pixels through NumPy views
  copies the neighbour into the current pixel and leaves the neighbour unchanged;
- the ImageNet-C pipeline saves each image as JPEG (quality 85) afterwards; that storage step is
  not part of :func:`corrupt`.

Checked once against the original code run on OpenCV 5.0, scikit-image 0.26 and ImageMagick
6.9.11 (Wand), 10 CIFAR-10 images x 5 severities, feeding both the same random numbers: all
corruptions give identical bytes, except ``elastic_transform`` (OpenCV's fixed-point warp: a
rare difference of 1/255) and ``defocus_blur`` (0.07 % of values differ by 1/255).

Every output is ``np.uint8`` of the float result in [0, 255], truncated as the recipes' ``np.uint8``
does; motion blur converts as ImageMagick does (:func:`image_ops.imagemagick_to_uint8`).
"""

from __future__ import annotations

import io
from typing import Callable

import numpy as np
from PIL import Image

from dyntta.data import image_ops as ops
from dyntta.data import frost as frost_source

CORRUPTIONS = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
"""The 15 corruptions in their published order (Hendrycks & Dietterich, ICLR 2019)."""

RECIPES = ("cifar", "imagenet")
RECIPE_SIZES = {(32, 32): "cifar", (224, 224): "imagenet"}

# Per-severity parameters (severity 1..5), copied as facts from make_cifar_c.py ("cifar") and
# make_imagenet_c.py ("imagenet"); the tuple layouts are those of the recipes' functions.
PARAMS: dict[str, dict[str, tuple]] = {
    "cifar": {
        "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
        "shot_noise": (500, 250, 100, 75, 50),
        "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
        "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),
        "glass_blur": ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
        "motion_blur": ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)),
        "zoom_blur": tuple(np.arange(1, top, 0.01) for top in (1.06, 1.11, 1.16, 1.21, 1.26)),
        "snow": (
            (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
            (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
            (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
            (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
            (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
        ),
        "frost": ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)),
        "fog": ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)),
        "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
        "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
        "elastic_transform": tuple(
            (32 * a, 32 * s, 32 * f)
            for a, s, f in ((0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06),
                            (0.1, 0.04, 0.05), (0.1, 0.03, 0.03))
        ),
        "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),
        "jpeg_compression": (80, 65, 58, 50, 40),
    },
    "imagenet": {
        "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
        "shot_noise": (60, 25, 12, 5, 3),
        "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),
        "defocus_blur": ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)),
        "glass_blur": ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)),
        "motion_blur": ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15)),
        "zoom_blur": (
            np.arange(1, 1.11, 0.01),
            np.arange(1, 1.16, 0.01),
            np.arange(1, 1.21, 0.02),
            np.arange(1, 1.26, 0.02),
            np.arange(1, 1.31, 0.03),
        ),
        "snow": (
            (0.1, 0.3, 3, 0.5, 10, 4, 0.8),
            (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
            (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
            (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
            (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
        ),
        "frost": ((1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)),
        "fog": ((1.5, 2), (2, 2), (2.5, 1.7), (2.5, 1.5), (3, 1.4)),
        "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),
        "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),
        # "244 should have been 224, but ultimately nothing is incorrect" (make_imagenet_c.py)
        "elastic_transform": tuple(
            (244 * a, 244 * s, 244 * f)
            for a, s, f in ((2, 0.7, 0.1), (2, 0.08, 0.2), (0.05, 0.01, 0.02),
                            (0.07, 0.01, 0.02), (0.12, 0.01, 0.02))
        ),
        "pixelate": (0.6, 0.5, 0.4, 0.3, 0.25),
        "jpeg_compression": (25, 18, 15, 10, 7),
    },
}

FOG_MAPSIZE = {"cifar": 32, "imagenet": 256}
FROST_RESIZE = {"cifar": 0.2, "imagenet": 1.0}
"""make_cifar_c.py shrinks the frost photographs by 0.2 before cropping; make_imagenet_c.py does not."""


def _to_uint8(x01: np.ndarray) -> np.ndarray:
    """The recipes' ``np.uint8(np.clip(x, 0, 1) * 255)`` (truncation)."""
    return (np.clip(x01, 0.0, 1.0) * 255).astype(np.uint8)


def gaussian_noise(x, c, rng, recipe):
    return _to_uint8(x / 255.0 + rng.normal(scale=c, size=x.shape))


def shot_noise(x, c, rng, recipe):
    return _to_uint8(rng.poisson(x / 255.0 * c) / c)


def impulse_noise(x, c, rng, recipe):
    out = x / 255.0
    flipped = rng.random(x.shape) <= c
    salted = rng.random(x.shape) <= 0.5
    out[flipped & salted] = 1.0
    out[flipped & ~salted] = 0.0
    return _to_uint8(out)


def defocus_blur(x, c, rng, recipe):
    radius, alias_blur = c
    return _to_uint8(ops.filter2d(x / 255.0, ops.disk_kernel(radius, alias_blur)))


def glass_blur(x, c, rng, recipe):
    sigma, delta, iterations = c
    n, h, w = x.shape[:3]
    out = (ops.gaussian_blur(x / 255.0, sigma) * 255).astype(np.uint8)
    images = np.arange(n)
    positions = [(r, c) for r in range(h - delta, delta, -1) for c in range(w - delta, delta, -1)]
    for _ in range(iterations):
        offsets = rng.integers(-delta, delta, size=(len(positions), 2, n))  # (dx, dy) per position
        for (row, col), (dx, dy) in zip(positions, offsets):
            out[images, row, col] = out[images, row + dy, col + dx]
    return _to_uint8(ops.gaussian_blur(out / 255.0, sigma))


def motion_blur(x, c, rng, recipe):
    radius, sigma = c
    angles = rng.uniform(-45, 45, size=len(x))
    return ops.imagemagick_to_uint8(ops.motion_blur(x.astype(np.float64), radius, sigma, angles))


def zoom_blur(x, c, rng, recipe):
    x = (x / 255.0).astype(np.float32)
    out = np.zeros_like(x)
    for factor in c:
        out += ops.clipped_zoom(x, factor)
    return _to_uint8((x + out) / (len(c) + 1))


def snow(x, c, rng, recipe):
    loc, scale, zoom, threshold, radius, sigma, mix = c
    x = (x / 255.0).astype(np.float32)
    n, h, w = x.shape[:3]
    layer = rng.normal(loc=loc, scale=scale, size=(n, h, w, 1))
    layer = ops.clipped_zoom(layer, zoom)[..., 0]
    layer[layer < threshold] = 0
    layer = (np.clip(layer, 0, 1) * 255).astype(np.uint8)
    angles = rng.uniform(-135, -45, size=n)
    layer = ops.imagemagick_to_uint8(ops.motion_blur(layer.astype(np.float64), radius, sigma, angles))
    layer = (layer / 255.0)[..., None]
    gray = x[..., 0:1] * 0.299 + x[..., 1:2] * 0.587 + x[..., 2:3] * 0.114
    x = mix * x + (1 - mix) * np.maximum(x, gray * 1.5 + 0.5)
    return _to_uint8(x + layer + np.rot90(layer, k=2, axes=(1, 2)))


def frost_scale(height: int, width: int, recipe: str, textures: str = "procedural") -> float:
    """The factor by which the frost textures are resized for ``height`` x ``width`` images: the
    recipe's (``FROST_RESIZE``) wherever every texture then covers the images (each image crops
    a texture drawn at random). Beyond the recipes, where one would not (images of 63 rows or
    105 columns or more with the CIFAR recipe, 315 or 527 with ImageNet's), the least factor that
    makes every texture larger than the images (bilinear, as the CIFAR recipe shrinks them)."""
    scale = FROST_RESIZE[recipe]
    if all(p.shape[0] > height and p.shape[1] > width
           for p in frost_source.load_textures(textures, scale)):
        return scale
    needed = max(max((height + 1) / p.shape[0], (width + 1) / p.shape[1])
                 for p in frost_source.load_textures(textures, 1.0))
    return max(scale, needed)


def frost(x, c, rng, recipe, textures: str = "procedural"):
    weight, texture_weight = c
    n, h, w = x.shape[:3]
    photos = frost_source.load_textures(textures, frost_scale(h, w, recipe, textures))
    out = np.empty(x.shape, dtype=np.float64)
    for i, index in enumerate(rng.integers(5, size=n)):  # the recipes draw randint(5): frost1..5
        photo = photos[index]
        top, left = rng.integers(0, photo.shape[0] - h), rng.integers(0, photo.shape[1] - w)
        out[i] = weight * x[i] + texture_weight * photo[top : top + h, left : left + w]
    return np.clip(out, 0, 255).astype(np.uint8)


def fog(x, c, rng, recipe):
    strength, decay = c
    x = x / 255.0
    n, h, w = x.shape[:3]
    mapsize = max(FOG_MAPSIZE[recipe], 1 << (max(h, w) - 1).bit_length())
    peak = x.max(axis=(1, 2, 3), keepdims=True)
    x = x + strength * ops.plasma_fractal(n, mapsize, decay, rng)[:, :h, :w, None]
    return _to_uint8(x * peak / (peak + strength))


def brightness(x, c, rng, recipe):
    hsv = ops.rgb_to_hsv(x / 255.0)
    hsv[..., 2] = np.clip(hsv[..., 2] + c, 0, 1)
    return _to_uint8(ops.hsv_to_rgb(hsv))


def contrast(x, c, rng, recipe):
    x = x / 255.0
    means = x.mean(axis=(1, 2), keepdims=True)
    return _to_uint8((x - means) * c + means)


def elastic_transform(x, c, rng, recipe):
    alpha, sigma, affine = c
    x = (x / 255.0).astype(np.float32)
    n, h, w = x.shape[:3]
    centre = np.array([h // 2, w // 2], dtype=np.float32)
    side = min(h, w) // 3
    src = np.array([centre + side, [centre[0] + side, centre[1] - side], centre - side], dtype=np.float64)
    src = np.broadcast_to(src, (n, 3, 2))
    dst = src + rng.uniform(-affine, affine, size=src.shape).astype(np.float32)
    x = ops.warp_affine(x.astype(np.float64), ops.affine_from_points(src, dst))
    dx = ops.gaussian_blur(rng.uniform(-1, 1, size=(n, h, w)), sigma, mode="reflect", truncate=3) * alpha
    dy = ops.gaussian_blur(rng.uniform(-1, 1, size=(n, h, w)), sigma, mode="reflect", truncate=3) * alpha
    rows, cols = np.mgrid[0:h, 0:w].astype(np.float64)
    out = ops.sample_bilinear(x, rows + dy.astype(np.float32), cols + dx.astype(np.float32), mode="reflect")
    return _to_uint8(out)


def _per_image_pil(x: np.ndarray, transform: Callable[[Image.Image], Image.Image]) -> np.ndarray:
    return np.stack([np.asarray(transform(Image.fromarray(image)).convert("RGB")) for image in x])


def pixelate(x, c, rng, recipe):
    h, w = x.shape[1:3]

    def transform(image: Image.Image) -> Image.Image:
        small = image.resize((int(w * c), int(h * c)), Image.BOX)
        return small.resize((w, h), Image.BOX)

    return _per_image_pil(x, transform)


def jpeg_compression(x, c, rng, recipe):
    def transform(image: Image.Image) -> Image.Image:
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=c)
        return Image.open(buffer)

    return _per_image_pil(x, transform)


FUNCTIONS: dict[str, Callable] = {name: globals()[name] for name in CORRUPTIONS}


def recipe_for(height: int, width: int) -> str:
    """The recipe of an image size: "cifar" for 32x32, "imagenet" for 224x224, else an error."""
    try:
        return RECIPE_SIZES[(height, width)]
    except KeyError:
        raise ValueError(
            f"no published corruption recipe for {height}x{width} images (CIFAR-10-C: 32x32, "
            f"ImageNet-C: 224x224); give one to apply it anyway: recipe 'cifar' or 'imagenet' "
            f"(recipe= in Python and in a grid's npz dataset, --recipe on the command line)"
        ) from None


def corrupt(
    images: np.ndarray,
    name: str,
    severity: int,
    seed: int | np.random.SeedSequence = 0,
    recipe: str | None = None,
    frost_textures: str = "procedural",
) -> np.ndarray:
    """Corrupt a batch of images with one of the 15 corruptions.

    Args:
        images: (N, H, W, 3) uint8.
        name: one of :data:`CORRUPTIONS`.
        severity: 1..5.
        seed: the same seed (and input) gives the same output.
        recipe: "cifar" (make_cifar_c.py) or "imagenet" (make_imagenet_c.py) parameters. Default:
            chosen by size, "cifar" for 32x32 and "imagenet" for 224x224; other sizes need an
            explicit recipe, whose parameters (many in pixels) are then applied unscaled.
        frost_textures: "procedural" (default) or "imagecorruptions" (the original photographs,
            read from that installed package); used by ``frost`` only.

    Returns:
        (N, H, W, 3) uint8 corrupted images.
    """
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8 or len(images) == 0:
        raise ValueError(
            f"images must be a non-empty uint8 array of shape (N, H, W, 3), got shape "
            f"{images.shape} dtype {images.dtype}"
        )
    if name not in FUNCTIONS:
        raise ValueError(f"unknown corruption {name!r}; expected one of {', '.join(CORRUPTIONS)}")
    if isinstance(severity, bool) or severity not in (1, 2, 3, 4, 5):
        raise ValueError(f"severity must be an int in 1..5, got {severity!r}")
    if recipe is None:
        recipe = recipe_for(*images.shape[1:3])
    elif recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; expected one of {', '.join(RECIPES)}")
    if frost_textures not in frost_source.SOURCES:
        raise ValueError(
            f"unknown frost_textures {frost_textures!r}; expected one of {', '.join(frost_source.SOURCES)}"
        )
    rng = np.random.default_rng(seed)
    params = PARAMS[recipe][name][severity - 1]
    if name == "frost":
        return frost(images, params, rng, recipe, frost_textures)
    return FUNCTIONS[name](images, params, rng, recipe)
