"""Whether the images just seen come from one domain, and which images are most likely of
each image's domain, read from their spectra (beyond the DYN paper).

Corruptions move where an image's energy sits across spatial frequencies (noise raises the high
frequencies, blur and fog lower them, contrast and brightness scale them all), far more than the
content of images of one domain does. Each image's signature is the log of its mean power in
``BANDS`` radial frequency bands per channel; a set of images is one domain when these spread
across it by less than ``ONE_DOMAIN_SPREAD`` (the mean over the signature's entries of their
standard deviation across the images, in nats) with at least ``MIN_IMAGES`` images, or by less
than ``FEW_IMAGES_SPREAD`` with ``FEWEST_IMAGES`` to ``MIN_IMAGES - 1``; a batch lies apart from
the images before it when its mean signature is ``SAME_DOMAIN_SHIFT`` squared standard errors or
more from theirs (:func:`domain_shift`); an image's nearest signatures are those of the images
most likely of its domain (:func:`nearest_spectra`).

The constants come from the spreads the CIFAR-10 and digits test images give, not from any accuracy
(``benchmarks/one_domain_spread.py``; docs/dyn-adaptive-rules.md, "A batch of one domain, read from
its spectra"): at severity 5 (seeds 0-2, the four stream scenarios), full batches of 64 from one
corruption spread by 0.14 to 0.97 nats and batches that mix corruptions by 1.24 to 2.37; of batches
of 32, none of one domain and 0-2.2% of the mixed ones fall on the wrong side of 1.2; of batches of
16, none of the mixed ones falls under 0.8; in 96-99% of the windows of 32 images truly of one
domain, the batch of 16 or 4 at their end lies under 4 squared standard errors from the rest. They
read the images only, so they do not depend on the network.
"""

from __future__ import annotations

import functools
import math

import torch
from torch.nn import functional as F

BANDS = 4
"""Radial frequency bands of the signature, of equal width up to the corner frequency."""

ONE_DOMAIN_SPREAD = 1.2
"""The largest spread (nats) of the signatures of ``MIN_IMAGES`` or more images that counts as
one domain."""

FEW_IMAGES_SPREAD = 0.8
"""The largest spread that counts as one domain for ``FEWEST_IMAGES`` to ``MIN_IMAGES - 1``
images: fewer images spread less even when they mix domains (of batches of 16 that mix, the
least spread 0.84 to 1.07 nats on the three image sets; of one domain, the median 0.45 to 0.64)."""

SAME_DOMAIN_SHIFT = 4.0
"""The largest :func:`domain_shift` between a batch and the images just before it for them to
count as one domain: of windows of 32 images truly of one domain, at B = 16 and 4, 96-99% fall
under it on the three image sets; of those that join the batch to another domain yet pass
``ONE_DOMAIN_SPREAD``, 13-39% at B = 16 and 65-81% at B = 4."""

EDGE = 1e-9
"""Bins this close below a band's edge count as on it."""

MIN_IMAGES = 32
"""The fewest images whose spread :func:`one_domain` judges at ``ONE_DOMAIN_SPREAD``."""

FEWEST_IMAGES = 16
"""The fewest images :func:`one_domain` judges at all."""


@functools.lru_cache(maxsize=8)
def band_means(height: int, width: int, bands: int, device: torch.device) -> torch.Tensor:
    """(height * (width // 2 + 1), bands) float64: the weights that average an ``rfft2`` power
    spectrum's bins into the mean of each radial band (:func:`log_band_power`); the same for
    every batch of one image size, so computed once."""
    fy = torch.fft.fftfreq(height, dtype=torch.float64, device=device)[:, None]
    fx = torch.fft.rfftfreq(width, dtype=torch.float64, device=device)[None, :]
    radius = torch.sqrt(fy.square() + fx.square()) / math.sqrt(0.5)
    # a bin on an edge joins the band above it (whatever the rounding); the corner the last
    band = torch.clamp((radius * bands + EDGE).long(), max=bands - 1).flatten()
    average = F.one_hot(band, bands).double()
    return average / average.sum(0).clamp_min(1.0)


def log_band_power(x: torch.Tensor, bands: int = BANDS) -> torch.Tensor:
    """Each image's log mean power per channel in ``bands`` radial frequency bands.

    The power spectrum of each channel with its mean removed (``rfft2``); the radial frequency
    ``sqrt(fy^2 + fx^2)`` (cycles per pixel) over that of the corner, ``sqrt(1/2)``, is cut into
    ``bands`` equal intervals (a bin on an edge joins the band above), and each band's mean
    power (plus 1e-8) is logged. A channel scaled by ``a`` moves every entry by ``2 log a`` and
    an added constant moves none.

    Args:
        x: (B, C, H, W) images.

    Returns:
        (B, bands * C): band 0 of every channel, then band 1, ...
    """
    spectrum = torch.fft.rfft2(x - x.mean((2, 3), keepdim=True))
    power = (spectrum.real.square() + spectrum.imag.square()).flatten(2)  # (B, C, bins)
    average = band_means(x.shape[2], x.shape[3], bands, x.device).to(power.dtype)
    return (power @ average).transpose(1, 2).reshape(x.shape[0], -1).add(1e-8).log()


def signature_spread(signatures: torch.Tensor) -> torch.Tensor:
    """How far (..., n, D) :func:`log_band_power` signatures spread across the n images: the
    mean over the D entries of their standard deviation (nats; a tensor of the leading shape)."""
    return signatures.std(-2).mean(-1)


def signature_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(n, m) Euclidean distances between the rows of ``a`` (n, D) and ``b`` (m, D), from exact
    differences (no matrix product), so that a row is at distance 0 from itself."""
    return torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")


def nearest_spectra(signatures: torch.Tensor, k: int, queries: int,
                    allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Indices into (P, D) :func:`log_band_power` signatures of the ``min(k, P)`` rows nearest
    (Euclidean) to each of the last ``queries`` rows, nearest first: the images most likely of
    each image's domain, whatever their content. With ``allowed``, a (P,) bool mask that
    allows the queries, only the ``min(k, allowed rows)`` nearest allowed rows.

    Returns:
        (queries, min(k, P)) int64 (fewer columns with ``allowed``).
    """
    if not 1 <= queries <= signatures.shape[0]:
        raise ValueError(f"queries must be in 1..{signatures.shape[0]} (the signatures' rows), "
                         f"got {queries}")
    distance = signature_distances(signatures[-queries:], signatures)
    n = signatures.shape[0]
    if allowed is not None:
        distance = distance.masked_fill(~allowed, float("inf"))
        n = int(allowed.sum())
    return distance.topk(min(k, n), dim=1, largest=False).indices


def domain_shift(signatures: torch.Tensor, batch: int) -> torch.Tensor:
    """How far the mean signature of the last ``batch`` of (n, D) :func:`log_band_power`
    signatures lies from that of the rows before them (:func:`two_sample_shift`; a 0-dim
    tensor)."""
    return two_sample_shift(signatures[:-batch], signatures[-batch:])


def two_sample_shift(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """How far the mean of (..., n_1, D) signatures ``before`` lies from that of (n_2, D)
    ``after``, in squared standard errors: the mean over the D entries of
    ``(m_1 - m_2)^2 / (s^2 (1 / n_1 + 1 / n_2))``, ``s^2`` the two groups' pooled variance (a
    tensor of the leading shape; near 1 when both come from one domain)."""
    n_1, n_2 = before.shape[-2], after.shape[-2]
    spread = (before - before.mean(-2, keepdim=True)).square().sum(-2) + \
        (after - after.mean(-2, keepdim=True)).square().sum(-2)
    variance = spread / (n_1 + n_2 - 2)
    difference = (after.mean(-2) - before.mean(-2)).square()
    return (difference / (variance * (1 / n_1 + 1 / n_2))).mean(-1)


def spread_threshold(n: int) -> float:
    """The largest spread of ``n`` >= ``FEWEST_IMAGES`` images' signatures that counts as one
    domain: ``ONE_DOMAIN_SPREAD`` for ``MIN_IMAGES`` or more, else ``FEW_IMAGES_SPREAD``."""
    return ONE_DOMAIN_SPREAD if n >= MIN_IMAGES else FEW_IMAGES_SPREAD


def one_domain(signatures: torch.Tensor) -> bool:
    """Whether images look like one domain: :func:`spread_says_one_domain` of their (n, D)
    :func:`log_band_power` signatures."""
    return bool(spread_says_one_domain(signatures))


def spread_says_one_domain(signatures: torch.Tensor) -> torch.Tensor:
    """Whether each set of n images of (..., n, D) :func:`log_band_power` signatures looks like
    one domain: their :func:`signature_spread` is under :func:`spread_threshold` ``(n)`` nats
    (never for fewer than ``FEWEST_IMAGES`` images). A bool tensor of the leading shape."""
    n = signatures.shape[-2]
    if n < FEWEST_IMAGES:
        return torch.zeros(signatures.shape[:-2], dtype=torch.bool, device=signatures.device)
    return signature_spread(signatures) < spread_threshold(n)
