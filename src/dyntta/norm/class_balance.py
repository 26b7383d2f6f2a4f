"""A window kept balanced over the model's predicted classes: a filter shared by BN layers.

Beyond the DYN paper. Under label shift (Wild) a batch holds a few classes, and the
statistics of the deep layers, which follow the labels, follow them too. NOTE (Gong et al.,
NeurIPS 2022, Sec. 3.2, prediction-balanced reservoir sampling) answers with a memory balanced
over predicted classes; here the deep layers' window keeps, of its remembered samples, only the
``per_class`` most recent of each predicted class, so that the statistics they add to a batch
come from every class seen lately in about equal parts, and each class's samples are its most
recent ones (the current domain's, where it lasts). Unlike NOTE's reservoir, nothing is drawn at
random: the same stream always gives the same statistics.

The method records the predicted classes after every forward (:meth:`ClassBalance.record`); the
layers ask, during the next forward, which of their remembered samples to keep
(:meth:`ClassBalance.keep`, the interface of :class:`~dyntta.norm.window_match.WindowMatch`).
Given a ``WindowMatch`` (``within``), the balance is taken among the samples it keeps: the most
recent of each class among those that look like the current domain.
"""

from __future__ import annotations

import torch

from dyntta.norm.window_match import WindowMatch


class ClassBalance:
    """The predicted classes of the last samples seen, and which of them a window keeps.

    Args:
        memory: how many past samples' classes to keep (at least the longest window that asks).
        per_class: how many of the most recent samples of each predicted class to keep (>= 1).
        within: None, or a filter whose kept samples the balance chooses from.
    """

    def __init__(self, memory: int, per_class: int, within: WindowMatch | None = None) -> None:
        if memory < 0:
            raise ValueError(f"memory must be >= 0 (samples), got {memory}")
        if per_class < 1:
            raise ValueError(f"per_class must be >= 1 (samples), got {per_class}")
        self.memory = memory
        self.per_class = per_class
        self.within = within
        self.reset()

    def reset(self) -> None:
        """Forget every class."""
        self.classes: torch.Tensor | None = None  # (N,) int64, oldest first
        # keep()'s answers since the last record(), with the ``within`` decision each came from
        self.decided: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}

    def record(self, classes: torch.Tensor, num_classes: int) -> None:
        """Append the (B,) predicted classes, in ``0..num_classes-1``, of the batch just
        forwarded."""
        self.num_classes = num_classes
        classes = classes.detach().long()
        if self.classes is not None:
            classes = torch.cat([self.classes, classes])
        self.classes = classes[-self.memory :] if self.memory else classes[:0]
        self.decided = {}

    def keep(self, n_window: int, batch_size: int) -> torch.Tensor:
        """(n_window,) bool: which of a layer's last ``n_window`` remembered samples (oldest
        first; the current batch of ``batch_size`` is not among them) to keep: the
        ``per_class`` most recent of each predicted class (among those ``within`` keeps).
        Computed once per recorded batch for all the layers that ask (again only where
        ``within`` has decided anew)."""
        if self.classes is None or self.classes.shape[0] < n_window:
            raise RuntimeError("ClassBalance.keep needs the predicted classes of every remembered "
                               "sample: record() must follow each forward")
        within = None if self.within is None else self.within.keep(n_window, batch_size)
        answer = self.decided.get((n_window, batch_size))
        if answer is not None and answer[0] is within:
            return answer[1]
        classes = self.classes[self.classes.shape[0] - n_window :]
        kept = torch.ones(n_window, dtype=torch.bool, device=classes.device) \
            if within is None else within
        if n_window:
            kept = self.balance(classes, kept)
        self.decided[n_window, batch_size] = within, kept
        return kept

    def balance(self, classes: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """Of the ``kept`` rows, those among the ``per_class`` most recent of their class."""
        one_hot = torch.nn.functional.one_hot(classes, self.num_classes) * kept[:, None]  # (n, K)
        later = one_hot.flip(0).cumsum(0).flip(0)  # kept same-class samples at or after a row
        return kept & ((later * one_hot).sum(1) <= self.per_class)
