"""Which remembered samples look like the current ones: a window filter shared by BN layers.

Beyond the DYN paper. A layer whose statistics follow the labels (a deep layer) gains
from a long window of past samples against label shift, but a long window also spans past
domains. The owner writes a signature of each batch's samples here (:meth:`WindowMatch.observe`;
``dyn_adaptive`` their spectra, :func:`~dyntta.norm.spectrum.log_band_power`, which tell
domains apart whatever the content); the deep layers then keep only the remembered samples that
are as close to the current pool as the pool's own members are to each other
(:meth:`WindowMatch.keep`). Closeness is the Euclidean distance of signatures. On a pool of one
domain, a block of remembered samples whose signatures are one domain of their own is judged
whole, by whether its signatures lie apart from the pool's: a domain is told from another far
better by many samples' mean than by any one sample.
"""

from __future__ import annotations

import torch

from dyntta.norm.spectrum import (
    FEWEST_IMAGES, SAME_DOMAIN_SHIFT, signature_distances, spread_says_one_domain,
    two_sample_shift)


class WindowMatch:
    """The signatures (one vector per sample) of the last samples seen.

    Args:
        memory: how many past samples' signatures to keep (at least the longest window that
            asks :meth:`keep`).
        pool: the most recent samples (batch included, at least the batch) that are always
            kept and that the older ones are judged against; its owner may set it anew after
            each :meth:`observe`, before the batch's first :meth:`keep`.
        quantile: q: an older sample is kept when its distance to the nearest pool member is
            at most the ``1 - q`` quantile of the pool members' distances to their nearest other
            member (0: as close as the pool's loneliest member; 0.5: as its median member).

    ``blocks``, 0 or k (its owner may set it with ``pool``; 0 at first): on a pool of one domain,
    the older samples in blocks of k counted back from the pool (the oldest block may be
    shorter), and a block of ``FEWEST_IMAGES`` or more whose signatures are one domain of their
    own (:func:`~dyntta.norm.spectrum.spread_says_one_domain`) is kept whole where they do not lie
    apart from the pool's (:func:`~dyntta.norm.spectrum.two_sample_shift` under
    ``SAME_DOMAIN_SHIFT``) and dropped whole where they do; the others' samples are judged one by
    one. ``dyn_adaptive`` sets k to the batch size on a batch of one domain, so that the blocks
    are, in a stream of one batch size, the batches as they came.
    """

    def __init__(self, memory: int, pool: int, quantile: float) -> None:
        if memory < 0 or pool < 0:
            raise ValueError(f"memory and pool must be >= 0 (samples), got {memory} and {pool}")
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {quantile}")
        self.memory = memory
        self.pool = pool
        self.quantile = quantile
        self.blocks = 0
        self.reset()

    def reset(self) -> None:
        """Forget every signature."""
        self.current: torch.Tensor | None = None  # the last ``memory`` signatures, then the batch's
        self.decided: dict[tuple[int, int], torch.Tensor] = {}  # keep()'s answers this batch

    def observe(self, signatures: torch.Tensor) -> None:
        """Record the (B, D) signatures of the current batch (once per forward)."""
        batch = signatures.detach()
        if self.current is not None and self.memory:
            batch = torch.cat([self.current[-self.memory :], batch])
        self.current = batch
        self.decided = {}

    def keep(self, n_window: int, batch_size: int) -> torch.Tensor:
        """(n_window,) bool: which of a layer's last ``n_window`` remembered samples (oldest
        first, those seen just before the current batch of ``batch_size``) to keep; computed once
        per batch for all the layers that ask."""
        if (n_window, batch_size) not in self.decided:
            self.decided[n_window, batch_size] = self.judge(n_window, batch_size)
        return self.decided[n_window, batch_size]

    def judge(self, n_window: int, batch_size: int) -> torch.Tensor:
        if self.current is None or self.current.shape[0] < n_window + batch_size:
            raise RuntimeError("WindowMatch.keep before observe saw these samples: the owner "
                               "must observe each batch before the layers keep")
        rows = self.current[self.current.shape[0] - n_window - batch_size :]
        n_pool = min(n_window + batch_size, max(self.pool, batch_size))
        older, pool = rows[:-n_pool], rows[-n_pool:]
        kept = torch.ones(n_window, dtype=torch.bool, device=rows.device)
        if older.shape[0] == 0 or n_pool < 2:
            return kept
        nearest = signature_distances(older, pool).min(1).values
        kept[: older.shape[0]] = nearest <= self.threshold(pool)
        if self.blocks:
            self.judge_blocks(older, pool, kept)
        return kept

    def judge_blocks(self, older: torch.Tensor, pool: torch.Tensor, kept: torch.Tensor) -> None:
        """Keep or drop whole, in ``kept`` (the older samples' first), each block of
        ``blocks`` older samples (counted back from the pool; the oldest may be shorter) of
        ``FEWEST_IMAGES`` or more whose signatures are one domain of their own: kept where they
        do not lie apart from the pool's."""
        n, size = older.shape[0], self.blocks
        if size < FEWEST_IMAGES:
            return
        rest = n % size
        parts = [(rest, older[rest:].reshape(-1, size, older.shape[1]))] if n >= size else []
        if rest >= FEWEST_IMAGES:
            parts.append((0, older[None, :rest]))
        for start, blocks in parts:  # the whole blocks, then the oldest, shorter one
            judged = spread_says_one_domain(blocks)
            near = two_sample_shift(blocks, pool) < SAME_DOMAIN_SHIFT
            rows = kept[start : start + blocks.shape[0] * blocks.shape[1]].view(blocks.shape[:2])
            rows.copy_(torch.where(judged[:, None], near[:, None], rows))

    def threshold(self, members: torch.Tensor) -> torch.Tensor:
        """The ``1 - quantile`` quantile of the members' distances to their nearest other
        member."""
        within = signature_distances(members, members)
        within.fill_diagonal_(float("inf"))  # a member is not its own neighbour
        return torch.quantile(within.min(1).values, 1.0 - self.quantile)

