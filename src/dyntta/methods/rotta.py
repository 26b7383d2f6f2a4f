"""RoTTA: robust test-time adaptation (Yuan et al., "Robust Test-Time Adaptation in Dynamic
Scenarios", CVPR 2023; code BIT-DA/RoTTA ``core/adapter/rotta.py``).

- Every BN layer becomes a robust BN (:class:`~dyntta.norm.RobustBatchNorm2d`): global
  statistics that move towards each training batch's by an EMA with ``alpha = 0.05``.
- A teacher (an EMA copy of the student) predicts every test batch, in eval mode; its
  predictions are returned. Each sample enters a category-balanced memory with timeliness and
  uncertainty (:class:`~dyntta.methods.memory.CSTU`, capacity 64) under the teacher's
  pseudo-label, with the entropy of the teacher's softmax as uncertainty.
- Every ``update_every = 64`` samples the pair trains on the memory, both in training mode (so
  both robust BNs update their statistics on it): the student sees a strong augmentation of the
  memory images, the teacher the images themselves, and the student minimises the cross-entropy
  to the teacher's softmax weighted by timeliness, ``w(a) = exp(-a) / (1 + exp(-a))`` with
  ``a = age / capacity`` (Eq. 8-9). Adam (lr 1e-3) steps the BN affine parameters, then the
  teacher's parameters follow, ``t = (1 - nu) * t + nu * s`` with ``nu = 0.001``.

Predictions use the teacher's state at the start of the batch; when an update falls inside a
batch (the stream is not aligned to ``update_every``), the memory holds exactly the samples up
to that point, as in the code's per-sample loop. The pseudo-labels and uncertainties cross to the
host once per batch: the memory's decisions are sequential (see :mod:`dyntta.methods.memory`).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from dyntta.methods.adam import make_adam
from dyntta.methods.augmentation import StrongAugmentation
from dyntta.methods.base import check_unit_interval
from dyntta.methods.gradient import GradientMethod, norm_layers_training
from dyntta.methods.memory import CSTU, MemoryConfig, update_chunks
from dyntta.methods.registry import register
from dyntta.methods.teacher import ema_update_, make_teacher, soft_cross_entropy
from dyntta.norm import RobustBatchNorm2d


@dataclasses.dataclass(frozen=True)
class RoTTAConfig(MemoryConfig):
    """Hyper-parameters of RoTTA (BIT-DA/RoTTA ``configs/adapter/rotta.yaml`` and
    ``core/configs/defaults.py``).

    lr: 1e-3, Adam with betas (0.9, 0.999), no weight decay (``OPTIM``; the code's optimiser,
        kept instead of the DYN paper's shared SGD).
    memory_size: 64 (``MEMORY_SIZE``).
    update_every: 64 samples between updates (``UPDATE_FREQUENCY``).
    nu: 0.001, the student's share in the teacher's EMA (``NU``).
    alpha: 0.05, the batch's weight in the robust BN statistics (``ALPHA``).
    lambda_t, lambda_u: 1.0 and 1.0, weights of timeliness and uncertainty in the memory's
        score (``LAMBDA_T``, ``LAMBDA_U``).
    seed: seeds the strong augmentation.
    """

    lr: float = 1e-3
    nu: float = 0.001
    alpha: float = 0.05
    lambda_t: float = 1.0
    lambda_u: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        check_unit_interval("nu", self.nu)
        check_unit_interval("alpha", self.alpha)
        if self.lambda_t < 0 or self.lambda_u < 0:
            raise ValueError(
                f"lambda_t and lambda_u must be >= 0, got {self.lambda_t} and {self.lambda_u}"
            )


@register
class RoTTA(GradientMethod):
    """Robust BN, CSTU memory, teacher-student with timeliness reweighting.

    Attributes (besides the student ``model`` and the ``teacher``, both in the state dict):
        memory: the :class:`CSTU` memory, created at the first batch (it needs the number of
            classes); cleared by ``reset()``.
        seen: samples seen since the last reset.
    """

    name = "rotta"
    Config = RoTTAConfig

    def make_norm_layer(self, bn: nn.BatchNorm2d) -> RobustBatchNorm2d:
        return RobustBatchNorm2d(bn, self.config.alpha)

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return make_adam(params, self.config.lr)

    def prepare(self, model: nn.Module) -> nn.Module:
        model = super().prepare(model)
        self.teacher = make_teacher(model)
        return model

    def on_reset(self) -> None:
        super().on_reset()
        self.memory: CSTU | None = None
        self.seen = 0
        self.augment = StrongAugmentation(self.config.seed)

    @torch.no_grad()
    def step(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        self.model.eval()
        self.teacher.eval()
        logits = self.teacher(x)
        probs = logits.softmax(1)
        uncertainty = -(probs * torch.log(probs + 1e-6)).sum(1)
        labels = probs.argmax(1)
        if self.memory is None:
            self.memory = CSTU(c.memory_size, logits.shape[1], c.lambda_t, c.lambda_u)
        labels, uncertainty = labels.tolist(), uncertainty.tolist()
        for start, end, update_after in update_chunks(x.shape[0], self.seen, c.update_every):
            self.memory.add(x[start:end], labels[start:end], uncertainty[start:end])
            self.seen += end - start
            if update_after:
                self.update()
        return logits

    @torch.enable_grad()
    def update(self) -> None:
        """One training step of the student on the memory, then the teacher's EMA; the robust
        BN layers of both are in training mode during it, every other layer in eval mode."""
        images = self.memory.images()
        ages = torch.tensor(self.memory.ages(), dtype=images.dtype, device=images.device)
        with norm_layers_training(self.model, self.teacher):
            with torch.no_grad():
                teacher_logits = self.teacher(images)
            student_logits = self.model(self.augment(images))
            weights = timeliness(ages / self.memory.capacity)
            self.descend((soft_cross_entropy(student_logits, teacher_logits) * weights).mean())
        ema_update_(self.teacher.parameters(), self.model.parameters(), 1.0 - self.config.nu)


def timeliness(age: torch.Tensor) -> torch.Tensor:
    """RoTTA's time-aware weight ``exp(-age) / (1 + exp(-age))`` (Eq. 8), i.e. ``sigmoid(-age)``."""
    return torch.sigmoid(-age)
