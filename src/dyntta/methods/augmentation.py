"""The strong test-time augmentation of CoTTA, reused by RoTTA and ViDA.

CoTTA (Wang et al., CVPR 2022, ``get_tta_transforms``), copied by RoTTA (BIT-DA/RoTTA,
``core/utils/custom_transforms.py``) and ViDA (Yangsenqiao/vida, ``cifar/vida.py``), composes,
on images in [0, 1]: clip; colour jitter with brightness in [0.6, 1.4], contrast [0.7, 1.3],
saturation [0.5, 1.5], hue [-0.06, 0.06] and gamma [0.7, 1.3] applied in a random order;
edge padding by half the image size; a random affine map (rotation in [-15, 15] degrees,
translation up to 1/16 of the size, scale in [0.9, 1.1], bilinear); Gaussian blur (kernel 5,
sigma in [0.001, 0.5]); centre crop back to the input size; horizontal flip with probability
0.5; Gaussian noise (std 0.005); clip.

As in those codes, where torchvision transforms receive the whole batch as one tensor, one set of
random parameters is drawn per call and applied to every image of the batch. The operations
follow torchvision's tensor semantics (ITU-R 601 grey, HSV hue rotation, reflect-padded blur)
but are written here in plain torch, so torchvision is not needed. Every draw comes from the
augmenter's own seeded generators. Grayscale images (B, 1, H, W) take the same operations as
torchvision applies to them: the image is its own grey, and saturation and hue leave it as it is.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch.nn import functional as F

GREY = (0.2989, 0.587, 0.114)


@dataclasses.dataclass(frozen=True)
class Ranges:
    """Parameter ranges of the strong augmentation (CoTTA's defaults)."""

    brightness: tuple[float, float] = (0.6, 1.4)
    contrast: tuple[float, float] = (0.7, 1.3)
    saturation: tuple[float, float] = (0.5, 1.5)
    hue: tuple[float, float] = (-0.06, 0.06)
    gamma: tuple[float, float] = (0.7, 1.3)
    degrees: float = 15.0
    translate: float = 1.0 / 16.0
    scale: tuple[float, float] = (0.9, 1.1)
    blur_sigma: tuple[float, float] = (0.001, 0.5)
    noise_std: float = 0.005


class StrongAugmentation:
    """Callable ``aug(x)`` for RGB or grayscale images ``x: (B, 3 or 1, H, W)`` in [0, 1];
    returns the same shape.

    Args:
        seed: seeds every random choice; two augmenters with the same seed give the same
            outputs for the same inputs.
        ranges: :class:`Ranges` (CoTTA's strong ranges by default).
    """

    def __init__(self, seed: int = 0, ranges: Ranges = Ranges()) -> None:
        self.ranges = ranges
        self.seed = seed
        self._params = torch.Generator().manual_seed(seed)
        self._noise: dict[torch.device, torch.Generator] = {}

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * float(torch.rand((), generator=self._params))

    def noise_generator(self, device: torch.device) -> torch.Generator:
        if device not in self._noise:
            seed = int(torch.randint(2**62, (), generator=self._params))
            self._noise[device] = torch.Generator(device=device).manual_seed(seed)
        return self._noise[device]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] not in (1, 3):
            raise ValueError(f"augmentation expects RGB or grayscale images (B, 3 or 1, H, W), "
                             f"got {tuple(x.shape)}")
        r = self.ranges
        h, w = x.shape[-2:]
        x = x.clamp(0.0, 1.0)
        x = self.colour_jitter(x)
        pad = h // 2
        x = F.pad(x, (pad, pad, pad, pad), mode="replicate")
        angle = self.uniform(-r.degrees, r.degrees)
        shift = (
            round(self.uniform(-r.translate * x.shape[-1], r.translate * x.shape[-1])),
            round(self.uniform(-r.translate * x.shape[-2], r.translate * x.shape[-2])),
        )
        x = affine(x, angle, shift, self.uniform(*r.scale))
        x = gaussian_blur(x, 5, self.uniform(*r.blur_sigma))
        x = center_crop(x, h, w)
        if self.uniform(0.0, 1.0) < 0.5:
            x = x.flip(-1)
        noise = torch.randn(
            x.shape, generator=self.noise_generator(x.device), device=x.device, dtype=x.dtype
        )
        return (x + r.noise_std * noise).clamp(0.0, 1.0)

    def colour_jitter(self, x: torch.Tensor) -> torch.Tensor:
        """ColorJitterPro: brightness, contrast, saturation, hue, gamma in a random order."""
        r = self.ranges
        order = torch.randperm(5, generator=self._params).tolist()
        factors = [
            self.uniform(*r.brightness),
            self.uniform(*r.contrast),
            self.uniform(*r.saturation),
            self.uniform(*r.hue),
            self.uniform(*r.gamma),
        ]
        ops = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue, adjust_gamma)
        for i in order:
            x = ops[i](x, factors[i])
        return x


def grey(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601-2 luma (B, 1, H, W) of RGB images (B, 3, H, W); grayscale images are their
    own."""
    if x.shape[1] == 1:
        return x
    weights = torch.tensor(GREY, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x * weights).sum(1, keepdim=True)


def blend(x: torch.Tensor, other: torch.Tensor, factor: float) -> torch.Tensor:
    """``factor * x + (1 - factor) * other`` clipped to [0, 1]."""
    return (factor * x + (1.0 - factor) * other).clamp(0.0, 1.0)


def adjust_brightness(x: torch.Tensor, factor: float) -> torch.Tensor:
    return blend(x, torch.zeros_like(x), factor)


def adjust_contrast(x: torch.Tensor, factor: float) -> torch.Tensor:
    return blend(x, grey(x).mean(dim=(1, 2, 3), keepdim=True), factor)


def adjust_saturation(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x if x.shape[1] == 1 else blend(x, grey(x), factor)


def adjust_gamma(x: torch.Tensor, gamma: float) -> torch.Tensor:
    """``x ** gamma`` after clamping to [1e-8, 1] (ColorJitterPro's guard against NaN)."""
    return x.clamp(1e-8, 1.0).pow(gamma).clamp(0.0, 1.0)


def adjust_hue(x: torch.Tensor, shift: float) -> torch.Tensor:
    """Rotate the hue by ``shift`` turns (in [-0.5, 0.5]) in HSV space (grayscale: none)."""
    if x.shape[1] == 1:
        return x
    h, s, v = rgb_to_hsv(x)
    return hsv_to_rgb(torch.remainder(h + shift, 1.0), s, v)


def rgb_to_hsv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hue in [0, 1), saturation and value, each (B, H, W), of RGB images (B, 3, H, W)."""
    r, g, b = x.unbind(1)
    maxc, _ = x.max(1)
    minc, _ = x.min(1)
    delta = maxc - minc
    grey_pixel = delta == 0
    s = delta / torch.where(maxc == 0, torch.ones_like(maxc), maxc)
    safe = torch.where(grey_pixel, torch.ones_like(delta), delta)
    rc, gc, bc = (maxc - r) / safe, (maxc - g) / safe, (maxc - b) / safe
    h = torch.where(maxc == r, bc - gc, torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = torch.where(grey_pixel, torch.zeros_like(h), h)
    return torch.remainder(h / 6.0, 1.0), s, maxc


def hsv_to_rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """RGB images (B, 3, H, W) from hue in [0, 1), saturation and value, each (B, H, W)."""
    sector = torch.floor(h * 6.0)
    f = h * 6.0 - sector
    sector = sector.long() % 6
    p = v * (1.0 - s)
    q = v * (1.0 - s * f)
    t = v * (1.0 - s * (1.0 - f))
    choices = torch.stack(
        [
            torch.stack([v, t, p], 1),
            torch.stack([q, v, p], 1),
            torch.stack([p, v, t], 1),
            torch.stack([p, q, v], 1),
            torch.stack([t, p, v], 1),
            torch.stack([v, p, q], 1),
        ],
        0,
    )  # (6, B, 3, H, W)
    index = sector.unsqueeze(0).unsqueeze(2).expand(1, -1, 3, -1, -1)
    return choices.gather(0, index).squeeze(0)


def affine(
    x: torch.Tensor, angle: float, shift: tuple[int, int], scale: float
) -> torch.Tensor:
    """Rotate by ``angle`` degrees and scale about the centre, then shift by ``(dx, dy)``
    pixels; bilinear sampling, zeros outside. ``x: (B, C, H, W)``."""
    h, w = x.shape[-2:]
    a = math.radians(angle)
    cos, sin = math.cos(a) / scale, math.sin(a) / scale
    # inverse map (output -> input) in pixel units about the centre, then to [-1, 1] coordinates
    dx, dy = shift
    inv = torch.tensor([[cos, sin], [-sin, cos]], dtype=x.dtype)
    offset = -(inv @ torch.tensor([float(dx), float(dy)], dtype=x.dtype))
    to_norm = torch.tensor([2.0 / w, 2.0 / h], dtype=x.dtype)
    theta = torch.empty(2, 3, dtype=x.dtype)
    theta[:, :2] = to_norm[:, None] * inv / to_norm[None, :]
    theta[:, 2] = to_norm * offset
    grid = F.affine_grid(
        theta.to(x.device).expand(x.shape[0], 2, 3), list(x.shape), align_corners=False
    )
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def gaussian_blur(x: torch.Tensor, kernel_size: int, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur with reflect padding (torchvision's ``gaussian_blur``)."""
    half = (kernel_size - 1) * 0.5
    t = torch.linspace(-half, half, kernel_size, dtype=x.dtype, device=x.device)
    k = torch.exp(-0.5 * (t / sigma).square())
    k = k / k.sum()
    c = x.shape[1]
    pad = kernel_size // 2
    x = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    x = F.conv2d(x, k.view(1, 1, 1, -1).expand(c, 1, 1, kernel_size), groups=c)
    return F.conv2d(x, k.view(1, 1, -1, 1).expand(c, 1, kernel_size, 1), groups=c)


def center_crop(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The central ``h x w`` window (torchvision's rounding of the offsets)."""
    top = int(round((x.shape[-2] - h) / 2.0))
    left = int(round((x.shape[-1] - w) / 2.0))
    return x[..., top : top + h, left : left + w]
