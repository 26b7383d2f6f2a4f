"""EATA: efficient anti-forgetting test-time adaptation (Niu et al., "Efficient Test-Time Model
Adaptation without Forgetting", ICML 2022; code mr-eggplant/EATA ``eata.py``, ``main.py``).

TENT's set-up (batch-statistics BN, SGD on the BN affine parameters) with three changes:

1. reliable samples only: entropy ``E < E0 = margin * ln C`` (Eqn. 3);
2. non-redundant samples only: ``|cos(m, p)| < d_margin`` where ``p`` is the sample's softmax and
   ``m`` the moving average of the softmax of past selected samples,
   ``m <- 0.9 m + 0.1 mean(p_selected)`` (Eqn. 4-5; the first batch initialises ``m`` with the
   mean over its reliable samples and skips this filter);
3. each selected sample's entropy weighted by ``exp(E0 - E)`` (Eqn. 6, detached), the loss the
   mean over selected samples, plus the Fisher regulariser
   ``fisher_alpha * sum_i F_i (theta_i - theta_i_source)^2`` (Eqn. 8-9).
No step is taken (momentum included) on a batch that selects no sample, as in the code.

Fisher information without source data: the code estimates ``F`` before adaptation on
``--fisher_size 2000`` in-distribution images without their labels, from the squared gradient
of the cross-entropy against the model's own predictions (pseudo-labels), averaged over batches.
No in-distribution data reaches a method here, so with ``fisher="stream"`` (default) the same
estimator runs on the first test batches until ``fisher_size`` samples have been seen: on each
of them the squared gradient of the pseudo-label cross-entropy (batch mean) is accumulated, at
the current parameters (the source ones on the first batch, then after the few warm-up updates
of lr 1e-4). Until the estimate is complete the regulariser is off (EATA runs as ETA); then
``F`` is the mean over those batches and the anchor ``theta_source`` the source parameters.
``fisher="off"`` is ETA, EATA without the regulariser (the code's ``--algorithm eta``).

The decision to step and the estimate's progress need the batch's selection counts on the host:
one ``.tolist()`` per batch, after the forward.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

import torch
from torch.nn import functional as F

from dyntta.methods.base import check_unit_interval
from dyntta.methods.gradient import (
    GradientMethod,
    SGDConfig,
    check_positive,
    entropy_margin,
    masked_mean,
    softmax_entropy,
)
from dyntta.methods.registry import register


@dataclasses.dataclass(frozen=True)
class EATAConfig(SGDConfig):
    """Hyper-parameters of EATA (optimiser fields: see :class:`SGDConfig`; EATA's ``main.py``
    builds ``SGD(params, lr, momentum=0.9)``, lr 1e-4 is the DYN paper's shared setting).

    margin: E0 as a fraction of ln C, 0.4 (``main.py``: ``--e_margin = 0.4 * ln(1000)``).
    d_margin: cosine-similarity threshold epsilon, 0.05 (``main.py``: ``--d_margin``).
    fisher: ``"stream"`` estimates the Fisher information on the first test batches with
        pseudo-labels (see the module docstring); ``"off"`` drops the regulariser (ETA).
    fisher_size: samples for the Fisher estimate, 2000 (``main.py``: ``--fisher_size``).
    fisher_alpha: weight beta of the regulariser, 2000 (``main.py``: ``--fisher_alpha``).

    ``PUBLISHED`` (the ``published`` benchmark protocol): ImageNet-C, the authors' code
    (mr-eggplant/EATA ``main.py``: ``SGD(params, 0.00025, momentum=0.9)``, the other values as
    above). The authors' code has no CIFAR setting; CIFAR-10-C and CIFAR-100-C take
    mariodoebler/test-time-adaptation's (``classification/cfgs/cifar10_c/eata.yaml`` and
    ``cifar100_c/eata.yaml``: Adam lr 1e-3, ``FISHER_ALPHA: 1.0``, ``D_MARGIN: 0.4`` and
    ``0.1``, ``MARGIN_E0`` 0.4 ln C). The stream (batch size) stays the grid's.
    """

    margin: float = 0.4
    d_margin: float = 0.05
    fisher: Literal["stream", "off"] = "stream"
    fisher_size: int = 2000
    fisher_alpha: float = 2000.0

    PUBLISHED: ClassVar[dict[str, dict[str, Any]]] = {
        "cifar10": {"optimizer": "adam", "lr": 1e-3, "fisher_alpha": 1.0, "d_margin": 0.4},
        "cifar100": {"optimizer": "adam", "lr": 1e-3, "fisher_alpha": 1.0, "d_margin": 0.1},
        "imagenet": {"lr": 2.5e-4},
    }

    def __post_init__(self):
        super().__post_init__()
        check_positive("margin", self.margin)
        check_unit_interval("d_margin", self.d_margin)
        if self.fisher not in ("stream", "off"):
            raise ValueError(f"fisher must be 'stream' or 'off', got {self.fisher!r}")
        if self.fisher_size < 1:
            raise ValueError(f"fisher_size must be >= 1 sample, got {self.fisher_size}")
        if not self.fisher_alpha >= 0:
            raise ValueError(f"fisher_alpha must be >= 0, got {self.fisher_alpha}")


@register
class EATA(GradientMethod):
    """TENT on reliable, non-redundant samples, entropy-weighted, with a Fisher regulariser.

    Attributes (method memory, cleared by ``reset()``):
        mean_probs: (K,) moving average of the selected samples' softmax, or None.
        num_reliable, num_selected: samples that passed the first / both filters so far (the
            code's ``num_samples_update_1`` / ``num_samples_update_2``).
        fisher: per adapted parameter, the Fisher estimate once complete, else None.
    """

    name = "eata"
    Config = EATAConfig

    def on_reset(self) -> None:
        super().on_reset()
        self.mean_probs: torch.Tensor | None = None
        self.num_reliable = 0
        self.num_selected = 0
        self.fisher: list[torch.Tensor] | None = None
        self.anchors: list[torch.Tensor] | None = None
        self.fisher_sum: list[torch.Tensor] | None = None
        self.fisher_batches = 0
        self.fisher_samples = 0

    def estimating_fisher(self) -> bool:
        return self.config.fisher == "stream" and self.fisher is None

    def accumulate_fisher(self, logits: torch.Tensor) -> None:
        """Add the squared gradient of the pseudo-label cross-entropy of this batch (0 for a
        parameter this batch did not reach, e.g. of a BN layer that did not run: the authors'
        code skips a parameter without a gradient); once ``fisher_size`` samples are in, fix
        ``fisher`` and the source ``anchors``."""
        params = self.adapted_parameters()
        loss = F.cross_entropy(logits, logits.argmax(1))
        gradients = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        squares = [torch.zeros_like(p) if g is None else g.square()
                   for p, g in zip(params, gradients)]
        if self.fisher_sum is None:
            self.fisher_sum = squares
        else:
            for total, square in zip(self.fisher_sum, squares):
                total.add_(square)
        self.fisher_batches += 1
        self.fisher_samples += logits.shape[0]
        if self.fisher_samples >= self.config.fisher_size:
            self.fisher = [s / self.fisher_batches for s in self.fisher_sum]
            self.fisher_sum = None
            self.anchors = self.source_parameters()

    def fisher_penalty(self) -> torch.Tensor:
        """``fisher_alpha * sum F (theta - theta_source)^2`` over the adapted parameters."""
        terms = [
            (f * (p - a).square()).sum()
            for f, p, a in zip(self.fisher, self.adapted_parameters(), self.anchors)
        ]
        return self.config.fisher_alpha * torch.stack(terms).sum()

    def select(self, entropy: torch.Tensor, probs: torch.Tensor, margin: float):
        """Boolean masks (B,): reliable, and reliable and non-redundant."""
        reliable = entropy < margin
        if self.mean_probs is None:
            return reliable, reliable
        similarity = F.cosine_similarity(self.mean_probs.unsqueeze(0), probs, dim=1)
        return reliable, reliable & (similarity.abs() < self.config.d_margin)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        logits = self.model(x)
        margin = entropy_margin(c.margin, logits.shape[1])
        entropy = softmax_entropy(logits)
        probs = logits.detach().softmax(1)
        reliable, selected = self.select(entropy, probs, margin)
        weight = torch.exp(margin - entropy.detach())
        loss = masked_mean(entropy * weight, selected)
        if self.fisher is not None:
            loss = loss + self.fisher_penalty()
        num_reliable, num_selected = torch.stack([reliable.sum(), selected.sum()]).tolist()
        if self.estimating_fisher():
            self.accumulate_fisher(logits)
        if num_selected > 0:
            batch_mean = masked_mean(probs, selected)
            self.mean_probs = (
                batch_mean if self.mean_probs is None else 0.9 * self.mean_probs + 0.1 * batch_mean
            )
            self.descend(loss)
        self.num_reliable += num_reliable
        self.num_selected += num_selected
        return logits.detach()

