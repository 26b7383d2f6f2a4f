"""Image operations behind the corruption recipes, re-implemented on NumPy / SciPy for batches.

The published recipes call scikit-image, OpenCV and ImageMagick (Wand); these functions
reproduce the operations they use, on batches ``(N, H, W, C)`` of float images:

- :func:`gaussian_blur` = ``skimage.filters.gaussian`` (``scipy.ndimage.gaussian_filter`` over
  the spatial axes, ``mode``/``truncate`` as given),
- :func:`disk_kernel` = the recipes' ``disk`` (an aliased disk smoothed by ``cv2.GaussianBlur``),
- :func:`clipped_zoom` = the recipes' ``clipped_zoom`` (``scipy.ndimage.zoom``, order 1, done
  separably by :func:`zoom_linear`),
- :func:`motion_blur` = ImageMagick's ``MotionBlurImage`` (one-sided Gaussian line kernel,
  edge virtual pixels), which the recipes call through Wand,
- :func:`plasma_fractal` = the recipes' diamond-square height map,
- :func:`rgb_to_hsv` / :func:`hsv_to_rgb` = ``skimage.color`` conversions,
- :func:`resize_bilinear` = ``cv2.resize(..., fx, fy)`` with ``INTER_LINEAR``,
- :func:`warp_affine` = ``cv2.getAffineTransform`` + ``cv2.warpAffine`` (bilinear,
  ``BORDER_REFLECT_101``).

Loops run over kernel taps, zoom factors or pixel positions, never over images.
"""

from __future__ import annotations

import math

import numpy as np


def _ndimage():
    """``scipy.ndimage``, imported on first use: it is a large part of ``import dyntta``."""
    from scipy import ndimage

    return ndimage


def gaussian_blur(x: np.ndarray, sigma: float, mode: str = "nearest", truncate: float = 4.0) -> np.ndarray:
    """Gaussian blur of (N, H, W[, C]) over H and W (skimage's defaults: mode nearest, truncate 4)."""
    sigmas = (0.0, sigma, sigma) + (0.0,) * (x.ndim - 3)
    return _ndimage().gaussian_filter(x, sigmas, mode=mode, truncate=truncate)


def _cv2_gaussian_kernel(size: int, sigma: float) -> np.ndarray:
    """``cv2.getGaussianKernel(size, sigma)`` for sigma > 0."""
    i = np.arange(size) - (size - 1) / 2
    k = np.exp(-(i**2) / (2 * sigma**2))
    return k / k.sum()


def disk_kernel(radius: float, alias_blur: float) -> np.ndarray:
    """The recipes' anti-aliased disk: a normalised 0/1 disk blurred by a 3x3 (5x5 if radius > 8)
    Gaussian of std ``alias_blur`` with OpenCV's reflect-101 border."""
    if radius <= 8:
        grid, size = np.arange(-8, 8 + 1), 3
    else:
        grid, size = np.arange(-radius, radius + 1), 5
    xx, yy = np.meshgrid(grid, grid)
    disk = (xx**2 + yy**2 <= radius**2).astype(np.float64)
    disk /= disk.sum()
    g = _cv2_gaussian_kernel(size, alias_blur)
    disk = _ndimage().correlate1d(disk, g, axis=0, mode="mirror")
    # float32 like the recipe's kernel: with it the filtered images match OpenCV's to the bit
    return _ndimage().correlate1d(disk, g, axis=1, mode="mirror").astype(np.float32)


def filter2d(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """``cv2.filter2D`` (correlation, centred anchor, reflect-101 border) of (N, H, W, C) per channel."""
    return _ndimage().correlate(x, kernel[None, :, :, None], mode="mirror")


def zoom_linear(x: np.ndarray, factor: float) -> np.ndarray:
    """``scipy.ndimage.zoom(x, (1, factor, factor, 1), order=1)`` of (N, H, W, C), separably:
    output size round(n * factor), output index i samples input i (n - 1) / (n_out - 1)."""
    for axis in (1, 2):
        n_in = x.shape[axis]
        n_out = int(round(n_in * factor))
        position = np.arange(n_out) * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(1)
        low = np.clip(np.floor(position).astype(np.int64), 0, max(n_in - 2, 0))
        high = np.minimum(low + 1, n_in - 1)
        shape = [1] * x.ndim
        shape[axis] = n_out
        frac = (position - low).reshape(shape)
        x = np.take(x, low, axis=axis) * (1 - frac) + np.take(x, high, axis=axis) * frac
    return x


def clipped_zoom(x: np.ndarray, factor: float) -> np.ndarray:
    """Zoom (N, H, W, C) into its centre by ``factor`` >= 1, keeping the size (order-1 spline)."""
    h, w = x.shape[1:3]
    ch, cw = math.ceil(h / factor), math.ceil(w / factor)
    top, left = (h - ch) // 2, (w - cw) // 2
    zoomed = zoom_linear(x[:, top : top + ch, left : left + cw], factor)
    trim_top, trim_left = (zoomed.shape[1] - h) // 2, (zoomed.shape[2] - w) // 2
    return zoomed[:, trim_top : trim_top + h, trim_left : trim_left + w]


def motion_blur(x: np.ndarray, radius: float, sigma: float, angles: np.ndarray) -> np.ndarray:
    """ImageMagick ``MotionBlurImage(radius, sigma, angle)`` of (N, H, W[, C]), angle per image.

    Kernel width 2 ceil(radius) + 1, weights exp(-i^2 / (2 sigma^2)) normalised; tap i reads the
    pixel at offset (ceil(i sin a - 0.5), ceil(i cos a - 0.5)) (rows, columns), clamped to the
    edge (ImageMagick's default edge virtual pixels).
    """
    width = int(2 * math.ceil(radius) + 1)
    taps = np.arange(width)
    weights = np.exp(-(taps**2) / (2.0 * sigma**2))
    weights /= weights.sum()
    n, h, w = x.shape[:3]
    rad = np.deg2rad(np.asarray(angles, dtype=np.float64))
    images = np.arange(n)[:, None, None]
    out = np.zeros(x.shape, dtype=np.float64)
    for i, weight in zip(taps, weights):
        dy = np.ceil(i * np.sin(rad) - 0.5).astype(np.int64)
        dx = np.ceil(i * np.cos(rad) - 0.5).astype(np.int64)
        rows = np.clip(np.arange(h)[None, :] + dy[:, None], 0, h - 1)[:, :, None]
        cols = np.clip(np.arange(w)[None, :] + dx[:, None], 0, w - 1)[:, None, :]
        out += weight * x[images, rows, cols]
    return out


def imagemagick_to_uint8(x: np.ndarray) -> np.ndarray:
    """ImageMagick's (Q16) output of 0..255-scaled values as 8-bit: rounded to 16 bits, then the
    high byte kept, i.e. floor(round(257 x) / 257)."""
    return np.clip(np.floor(np.rint(x * 257.0) / 257.0), 0, 255).astype(np.uint8)


def plasma_fractal(n: int, mapsize: int, wibble_decay: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` diamond-square height maps (n, mapsize, mapsize) in [0, 1]; ``mapsize`` a power of 2.

    The recipes' ``plasma_fractal``: initial wibble 100, each new point is the mean of its four
    neighbours (sum / 4) plus wibble * U(-wibble, wibble); wibble /= ``wibble_decay`` per level.
    """
    if mapsize < 2 or mapsize & (mapsize - 1):
        raise ValueError(f"mapsize must be a power of two >= 2, got {mapsize}")
    maps = np.zeros((n, mapsize, mapsize))
    step, wibble = mapsize, 100.0

    def wibbled_mean(total: np.ndarray) -> np.ndarray:
        return total / 4 + wibble * rng.uniform(-wibble, wibble, total.shape)

    while step >= 2:
        half = step // 2
        corners = maps[:, 0:mapsize:step, 0:mapsize:step]
        squares = corners + np.roll(corners, -1, axis=1)
        squares = squares + np.roll(squares, -1, axis=2)
        maps[:, half:mapsize:step, half:mapsize:step] = wibbled_mean(squares)
        centres = maps[:, half:mapsize:step, half:mapsize:step]
        corners = maps[:, 0:mapsize:step, 0:mapsize:step]
        top = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=2)
        maps[:, 0:mapsize:step, half:mapsize:step] = wibbled_mean(top)
        left = centres + np.roll(centres, 1, axis=2) + corners + np.roll(corners, -1, axis=1)
        maps[:, half:mapsize:step, 0:mapsize:step] = wibbled_mean(left)
        step //= 2
        wibble /= wibble_decay
    maps -= maps.min(axis=(1, 2), keepdims=True)
    return maps / maps.max(axis=(1, 2), keepdims=True)


def rgb_to_hsv(rgb: np.ndarray) -> np.ndarray:
    """``skimage.color.rgb2hsv`` of (..., 3) values in [0, 1]."""
    v = rgb.max(axis=-1)
    delta = v - rgb.min(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.where(delta == 0, 0.0, delta / v)
        r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
        h = np.zeros_like(v)
        h = np.where(r == v, (g - b) / delta, h)
        h = np.where(g == v, 2.0 + (b - r) / delta, h)
        h = np.where(b == v, 4.0 + (r - g) / delta, h)
    h = np.where(delta == 0, 0.0, (h / 6.0) % 1.0)
    return np.stack([h, s, v], axis=-1)


def hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    """``skimage.color.hsv2rgb`` of (..., 3) HSV values in [0, 1]."""
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    sector = np.floor(h * 6)
    f = h * 6 - sector
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    choices = np.stack([
        np.stack(c, axis=-1)
        for c in ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))
    ])
    index = (sector.astype(np.int64) % 6)[None, ..., None]
    return np.take_along_axis(choices, np.broadcast_to(index, (1, *hsv.shape)), axis=0)[0]


def resize_bilinear(image: np.ndarray, scale: float) -> np.ndarray:
    """``cv2.resize(image, (0, 0), fx=scale, fy=scale)`` (INTER_LINEAR, half-pixel centres,
    no antialiasing) of one (H, W, C) uint8 image; the output is rounded to uint8."""
    h, w = image.shape[:2]
    out_h, out_w = int(round(h * scale)), int(round(w * scale))

    def axis_weights(n_in: int, n_out: int):
        src = np.clip((np.arange(n_out) + 0.5) / scale - 0.5, 0, None)
        lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, src - lo

    r0, r1, fr = axis_weights(h, out_h)
    c0, c1, fc = axis_weights(w, out_w)
    img = image.astype(np.float64)
    top = img[r0][:, c0] * (1 - fc)[None, :, None] + img[r0][:, c1] * fc[None, :, None]
    bottom = img[r1][:, c0] * (1 - fc)[None, :, None] + img[r1][:, c1] * fc[None, :, None]
    out = top * (1 - fr)[:, None, None] + bottom * fr[:, None, None]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def affine_from_points(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``cv2.getAffineTransform``: the (N, 2, 3) maps sending the 3 points ``src`` to ``dst``
    ((N, 3, 2) each, as (x, y))."""
    ones = np.ones((*src.shape[:-1], 1))
    a = np.concatenate([src, ones], axis=-1)  # (N, 3, 3)
    return np.swapaxes(np.linalg.solve(a, dst), 1, 2)


def warp_affine(x: np.ndarray, matrices: np.ndarray) -> np.ndarray:
    """``cv2.warpAffine(x, M, (W, H), borderMode=BORDER_REFLECT_101)`` of (N, H, W, C), M per image:
    output pixel (x, y) takes the bilinear input value at M^-1 (x, y)."""
    n, h, w, c = x.shape
    full = np.concatenate([matrices, np.broadcast_to([[[0.0, 0.0, 1.0]]], (n, 1, 3))], axis=1)
    inverse = np.linalg.inv(full)[:, :2]
    rows, cols = np.mgrid[0:h, 0:w].astype(np.float64)
    src_x = inverse[:, 0, 0, None, None] * cols + inverse[:, 0, 1, None, None] * rows + inverse[:, 0, 2, None, None]
    src_y = inverse[:, 1, 0, None, None] * cols + inverse[:, 1, 1, None, None] * rows + inverse[:, 1, 2, None, None]
    return sample_bilinear(x, src_y, src_x, mode="mirror")


def sample_bilinear(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, mode: str) -> np.ndarray:
    """Order-1 samples of (N, H, W, C) at per-image coordinates ``rows``, ``cols`` (N, H', W')
    (``scipy.ndimage.map_coordinates`` boundary ``mode``); the same position in every channel."""
    n, c = x.shape[0], x.shape[3]
    shape = (*rows.shape, c)
    coords = np.stack([
        np.broadcast_to(np.arange(n)[:, None, None, None], shape),
        np.broadcast_to(rows[..., None], shape),
        np.broadcast_to(cols[..., None], shape),
        np.broadcast_to(np.arange(c), shape),
    ]).astype(np.float64)
    return _ndimage().map_coordinates(x, coords, order=1, mode=mode)
