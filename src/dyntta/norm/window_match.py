"""Which remembered samples look like the current ones: a window filter shared by BN layers.

Beyond the DYN paper. A layer whose statistics follow the labels (a deep layer) gains
from a long window of past samples against label shift, but a long window also spans past
domains. One layer that still separates domains (a shallow one) writes each batch's instance
means here (:meth:`WindowMatch.observe`); the deep layers then keep only the remembered samples
that are as close to the current pool as the pool's own members are to each other
(:meth:`WindowMatch.keep`). Closeness is LISC's cosine similarity of instance means.
"""

from __future__ import annotations

import torch

from dyntta.norm.lisc import unit_rows


class WindowMatch:
    """The signatures (unit-norm instance means at one layer) of the last samples seen.

    Args:
        memory: how many past samples' signatures to keep (at least the longest window that
            asks :meth:`keep`).
        pool: the most recent samples (batch included, at least the batch) that are always
            kept and that the older ones are judged against; a layer's ``window`` with
            ``top_up``.
        quantile: an older sample is kept when its highest similarity to the pool is at least
            this quantile of the pool members' similarities to their nearest other member
            (0: as close as the pool's loneliest member; 0.5: as its median member).
    """

    def __init__(self, memory: int, pool: int, quantile: float) -> None:
        if memory < 0 or pool < 0:
            raise ValueError(f"memory and pool must be >= 0 (samples), got {memory} and {pool}")
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {quantile}")
        self.memory = memory
        self.pool = pool
        self.quantile = quantile
        self.reset()

    def reset(self) -> None:
        """Forget every signature."""
        self.current: torch.Tensor | None = None  # the last ``memory`` signatures, then the batch's
        self.decided: dict[tuple[int, int], torch.Tensor] = {}  # keep()'s answers this batch

    def observe(self, mu: torch.Tensor) -> None:
        """Record the (B, C) instance means of the current batch (once per forward)."""
        batch = unit_rows(mu.detach())
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
            raise RuntimeError("WindowMatch.keep before observe saw these samples: the observing "
                               "layer must run before the layers that keep")
        rows = self.current[self.current.shape[0] - n_window - batch_size :]
        n_pool = min(n_window + batch_size, max(self.pool, batch_size))
        older, pool = rows[:-n_pool], rows[-n_pool:]
        kept = torch.ones(n_window, dtype=torch.bool, device=rows.device)
        if older.shape[0] == 0 or n_pool < 2:
            return kept
        kept[: older.shape[0]] = (older @ pool.T).max(1).values >= self.threshold(pool)
        return kept

    def threshold(self, members: torch.Tensor) -> torch.Tensor:
        """The ``quantile`` of the members' similarities to their nearest other member."""
        within = members @ members.T
        within.fill_diagonal_(-2.0)  # below any cosine: a member is not its own neighbour
        return torch.quantile(within.max(1).values, self.quantile)
