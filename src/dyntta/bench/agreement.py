"""Rank agreement of two orderings of the same methods: Kendall's tau-b."""

from __future__ import annotations

import numpy as np


def kendall_tau(x, y) -> np.ndarray:
    """Kendall's tau-b between ``x`` and ``y`` along their last axis (scores of the same n
    items); leading axes broadcast, so rows of bootstrap draws go at once. Concordant minus
    discordant pairs over the square root of the product of the pairs untied in each; NaN where
    either side is all ties.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    i, j = np.triu_indices(x.shape[-1], 1)
    dx, dy = np.sign(x[..., i] - x[..., j]), np.sign(y[..., i] - y[..., j])
    untied = np.count_nonzero(dx, axis=-1) * np.count_nonzero(dy, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(untied > 0, (dx * dy).sum(-1) / np.sqrt(untied), np.nan)
