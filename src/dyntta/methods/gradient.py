"""What the gradient-based (backward) methods share.

TENT's recipe (Wang et al., ICLR 2021; DequanWang/tent ``tent.py``), reused by EATA, SAR and
their successors: every ``nn.BatchNorm2d`` normalises with the current batch's statistics, only
the BN affine parameters (``weight``, ``bias``) are adapted, by an SGD optimiser, on a loss built
from the softmax entropy of the predictions. Each batch is predicted with the parameters from
before its own update, as in the authors' code (``forward_and_adapt`` returns the outputs of the
forward that produced the loss).

A subclass of :class:`GradientMethod` states its ``Config`` (a subclass of :class:`SGDConfig`) and
its :meth:`~dyntta.methods.base.Method.step`; it may change the normalisation layer
(:meth:`GradientMethod.make_norm_layer`), which layers adapt (:meth:`GradientMethod.adapts`) and
the optimiser (:meth:`GradientMethod.make_optimizer`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Iterator, Literal

import torch
from torch import nn

from dyntta.methods.base import Method
from dyntta.norm import SourceNorm2d, TrainModeBatchNorm2d, replace_batchnorm


@dataclasses.dataclass(frozen=True)
class SGDConfig:
    """The optimiser shared by the gradient methods.

    lr: 1e-4, the DYN paper's shared setting for every backward baseline (batch size 64, SGD).
    momentum: 0.9, as the TENT, EATA and SAR codes build their SGD (``momentum=0.9``); with
        Adam, its first beta (TENT's ``OPTIM.BETA = 0.9``).
    weight_decay: 0, as all three codes.
    nesterov: False, as EATA's and SAR's ``torch.optim.SGD(params, lr, momentum=0.9)``.
    optimizer: ``"sgd"`` (the DYN paper's shared setting) or ``"adam"``
        (``Adam(params, lr, betas=(momentum, 0.999), weight_decay)``, TENT's ``setup_optimizer``
        for ``OPTIM.METHOD = 'Adam'``, its CIFAR setting).
    """

    lr: float = 1e-4
    momentum: float = 0.9
    weight_decay: float = 0.0
    nesterov: bool = False
    optimizer: Literal["sgd", "adam"] = "sgd"

    def __post_init__(self):
        check_positive("lr", self.lr)
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")
        if self.optimizer == "adam" and self.nesterov:
            raise ValueError("nesterov=True is an SGD option; Adam takes nesterov=False")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov=True needs momentum > 0")


def build_optimizer(params: list[nn.Parameter], config: SGDConfig) -> torch.optim.Optimizer:
    """The optimiser of ``config`` over ``params``: SGD (no dampening) or Adam."""
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, betas=(config.momentum, 0.999),
                                weight_decay=config.weight_decay)
    return torch.optim.SGD(
        params,
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        nesterov=config.nesterov,
    )


def softmax_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of ``softmax(logits)`` per row: (B, K) -> (B,)."""
    return -(logits.softmax(1) * logits.log_softmax(1)).sum(1)


def entropy_margin(fraction: float, num_classes: int) -> float:
    """``fraction * ln(num_classes)``: EATA's and SAR's reliability threshold E0 (nats)."""
    return fraction * math.log(num_classes)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over dim 0 of ``values`` (B, ...) at the rows ``mask`` (B,) selects, without a host
    round trip: (B,) -> scalar, (B, K) -> (K,).

    Equals ``values[mask].mean(0)`` when the mask selects something; an empty selection gives 0
    with a zero gradient (indexing would give NaN, whose backward also leaves zero gradients).
    """
    weights = mask.to(values.dtype).reshape(-1, *([1] * (values.ndim - 1)))
    return (values * weights).sum(0) / weights.sum().clamp_min(1.0)


@contextlib.contextmanager
def norm_layers_training(*models: nn.Module) -> Iterator[None]:
    """Put only the normalisation layers (``SourceNorm2d``) of ``models`` in training mode for
    the block, and back in eval mode after it: a method's update step trains the layers it
    adapts, while the user's other layers (dropout, ...) keep their eval behaviour."""
    layers = [m for model in models for m in model.modules() if isinstance(m, SourceNorm2d)]
    for layer in layers:
        layer.train()
    try:
        yield
    finally:
        for layer in layers:
            layer.eval()


def check_positive(name: str, value: float) -> None:
    """Raise ``ValueError`` unless ``value > 0``."""
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def check_module_names(name: str, value: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless ``value`` is a tuple of module names (e.g. ``frozen``)."""
    if isinstance(value, str) or not all(isinstance(n, str) for n in value):
        raise ValueError(f"{name} must be a tuple of module names, got {value!r}")


class GradientMethod(Method):
    """Base of the methods that adapt BN affine parameters by gradient descent.

    :meth:`prepare` swaps every ``nn.BatchNorm2d`` for :meth:`make_norm_layer` (batch statistics
    by default), freezes every parameter but the affine ones of the layers :meth:`adapts`
    accepts, and keeps all other modules in eval mode. :meth:`on_reset` builds a fresh optimiser,
    so ``reset()`` restores the source weights and an empty optimiser state.

    The authors' codes put the whole model in train mode; here only the BN layers behave as in
    training (batch statistics, whatever ``model.training`` says), so dropout-like layers stay
    deterministic. The CIFAR ResNets have none, so nothing changes for them.

    Attributes:
        adapted_names: names (relative to ``self.model``) of the adapted parameters.
        optimizer: the optimiser over those parameters.
    """

    Config = SGDConfig
    backward = True
    adapted_names: list[str]
    optimizer: torch.optim.Optimizer

    def make_norm_layer(self, bn: nn.BatchNorm2d) -> SourceNorm2d:
        """The layer that replaces ``bn``; default: batch statistics (TENT's configuration)."""
        return TrainModeBatchNorm2d(bn)

    def adapts(self, module_name: str) -> bool:
        """Whether the affine parameters of the norm layer at ``module_name`` are adapted: all
        but those inside a module named in the config's ``frozen`` field, if it has one (inside:
        a component of the dotted name equals an entry, e.g. ``"layer4"``)."""
        frozen = getattr(self.config, "frozen", ())
        return not set(module_name.split(".")) & set(frozen)

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return build_optimizer(params, self.config)

    def prepare(self, model: nn.Module) -> nn.Module:
        replace_batchnorm(model, self.make_norm_layer)
        model.eval()
        model.requires_grad_(False)
        names = []
        for module_name, module in model.named_modules():
            if isinstance(module, SourceNorm2d) and module.weight is not None:
                if self.adapts(module_name):
                    module.requires_grad_(True)
                    names += [f"{module_name}.weight", f"{module_name}.bias"]
        if not names:
            raise ValueError(
                f"{self.name!r} adapts the affine parameters (weight, bias) of BatchNorm2d "
                f"layers, but {type(model).__name__} has no BatchNorm2d with affine=True "
                "outside the layers this method's config excludes"
            )
        self.adapted_names = names
        return model

    def adapted_parameters(self) -> list[nn.Parameter]:
        """The adapted parameters, in the order of :attr:`adapted_names`."""
        params = dict(self.model.named_parameters())
        return [params[name] for name in self.adapted_names]

    def source_parameters(self) -> list[torch.Tensor]:
        """Copies of the source values of the adapted parameters, on their current device."""
        return [
            self._source_state[f"model.{name}"].to(p, copy=True)
            for name, p in zip(self.adapted_names, self.adapted_parameters())
        ]

    def on_reset(self) -> None:
        self.optimizer = self.make_optimizer(self.adapted_parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Predict and adapt; works inside ``torch.no_grad()`` and ``torch.inference_mode()``
        (an inference-mode input is cloned into a normal tensor first)."""
        with torch.inference_mode(False), torch.enable_grad():
            if x.is_inference():
                x = x.clone()
            return super().forward(x)

    def descend(self, loss: torch.Tensor) -> None:
        """One optimiser step on ``loss``; gradients are cleared before and after."""
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
