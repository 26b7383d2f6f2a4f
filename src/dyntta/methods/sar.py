"""SAR: sharpness-aware and reliable entropy minimisation (Niu et al., "Towards Stable Test-Time
Adaptation in Dynamic Wild World", ICLR 2023; code mr-eggplant/SAR ``sar.py``, ``sam.py``,
``main.py``).

Per batch, with ``E0 = margin * ln C`` and the BN affine parameters ``theta`` (TENT's set-up):

1. ``g = grad mean_{E_i < E0} E_i(theta)`` (reliable entropy, Eqn. 2);
2. ``theta' = theta + rho * g / (||g|| + 1e-12)`` (SAM's ascent step, Eqn. 4);
3. ``g' = grad mean E_i(theta')`` over the samples reliable both at ``theta`` and at ``theta'``;
4. ``theta <- SGD step from theta with g'`` (Eqn. 5);
5. model recovery: ``ema <- 0.9 ema + 0.1 L(theta')`` (the first value initialises it; batches
   with no sample left after step 3 leave it unchanged); when ``ema < reset_constant`` the
   model, the optimiser and ``ema`` return to the source state.

As in the code, the SGD step is taken on every batch, so momentum keeps moving the parameters
when no sample is reliable (the gradients are then zero). The recovery test needs ``ema`` on
the host: one ``.tolist()`` per batch, after the update.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from dyntta.methods.gradient import (
    GradientMethod,
    SGDConfig,
    check_module_names,
    check_positive,
    entropy_margin,
    masked_mean,
    softmax_entropy,
)
from dyntta.methods.registry import register


@dataclasses.dataclass(frozen=True)
class SARConfig(SGDConfig):
    """Hyper-parameters of SAR (optimiser fields: see :class:`SGDConfig`; SAR's ``main.py`` wraps
    ``SGD(lr, momentum=0.9)`` in SAM; lr 1e-4 is the DYN paper's shared setting).

    margin: E0 as a fraction of ln C, 0.4 (``sar.py``: ``margin_e0 = 0.4 * ln(1000)``).
    rho: SAM's neighbourhood radius, 0.05 (``sam.py`` default; ``main.py`` does not change it).
    reset_constant: recovery threshold e_m on the loss's moving average, 0.2 (``sar.py``).
    frozen: names of child modules whose norm layers are not adapted, ``("layer4",)``: the code
        skips a ResNet's last stage (``collect_params``). A module is frozen when any component of
        its dotted name equals an entry; the CIFAR ResNet-20/26 have no ``layer4``.

    ``PUBLISHED`` (the ``published`` benchmark protocol): ImageNet-C, the authors' code
    (mr-eggplant/SAR ``main.py``: SAM over ``SGD(lr, momentum=0.9)``, lr 2.5e-4 for ResNet-50
    at batch >= 32). The authors' code has no CIFAR setting; CIFAR-10-C and CIFAR-100-C take
    mariodoebler/test-time-adaptation's (``classification/cfgs/cifar10_c/sar.yaml``: lr 1e-3;
    its SAR builds SAM over SGD with momentum 0.9 whatever ``OPTIM.METHOD`` says).
    """

    margin: float = 0.4
    rho: float = 0.05
    reset_constant: float = 0.2
    frozen: tuple[str, ...] = ("layer4",)

    PUBLISHED: ClassVar[dict[str, dict[str, Any]]] = {
        "cifar10": {"lr": 1e-3},
        "cifar100": {"lr": 1e-3},
        "imagenet": {"lr": 2.5e-4},
    }

    def __post_init__(self):
        super().__post_init__()
        check_positive("margin", self.margin)
        if not self.rho >= 0:
            raise ValueError(f"rho must be >= 0, got {self.rho}")
        if not self.reset_constant >= 0:
            raise ValueError(f"reset_constant must be >= 0, got {self.reset_constant}")
        check_module_names("frozen", self.frozen)


@register
class SAR(GradientMethod):
    """Reliable entropy minimisation with a SAM update and model recovery.

    Attributes (method memory, cleared by ``reset()``):
        ema: moving average of the second-step loss, or None.
        num_recoveries: how many times recovery has reset the model since construction
            (survives recovery itself, cleared only by a ``reset()`` from outside).
    """

    name = "sar"
    Config = SARConfig

    def on_reset(self) -> None:
        super().on_reset()
        self.ema: float | None = None
        self.num_recoveries = 0

    def ascend(self) -> list[torch.Tensor]:
        """SAM's first step: move each parameter by ``rho * g / (||g|| + 1e-12)`` (global norm
        over all adapted parameters); returns the parameters' previous values."""
        params = self.adapted_parameters()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        scale = self.config.rho / (norm + 1e-12)
        previous = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(g * scale)
        return previous

    def restore(self, previous: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, value in zip(self.adapted_parameters(), previous):
                p.copy_(value)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        self.optimizer.zero_grad()
        logits = self.model(x)
        margin = entropy_margin(c.margin, logits.shape[1])
        entropy = softmax_entropy(logits)
        reliable = entropy < margin
        masked_mean(entropy, reliable).backward()
        previous = self.ascend()
        self.optimizer.zero_grad()
        entropy2 = softmax_entropy(self.model(x))
        kept = reliable & (entropy2 < margin)
        loss2 = masked_mean(entropy2, kept)
        loss2.backward()
        self.restore(previous)
        self.optimizer.step()
        self.optimizer.zero_grad()
        num_kept, value = torch.stack([kept.sum().to(loss2.dtype), loss2.detach()]).tolist()
        if num_kept > 0:
            self.ema = value if self.ema is None else 0.9 * self.ema + 0.1 * value
        if self.ema is not None and self.ema < c.reset_constant:
            recoveries = self.num_recoveries
            self.reset()
            self.num_recoveries = recoveries + 1
        return logits.detach()
