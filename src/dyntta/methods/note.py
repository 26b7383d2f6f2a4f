"""NOTE: non-i.i.d. test-time adaptation (Gong et al., "NOTE: Robust Continual Test-time
Adaptation Against Temporal Correlation", NeurIPS 2022; code TaesikGong/NOTE
``learner/note.py``, ``utils/memory.py``, ``tta.sh``).

- Every BN layer becomes IABN (:class:`~dyntta.norm.InstanceAwareBatchNorm2d`, k = 4). Test
  samples are predicted in eval mode, i.e. each sample's instance statistics shrunk towards the
  running statistics ("batch-free inference", ``--use_learned_stats``); the same prediction is
  the pseudo-label under which the sample enters the PBRS memory
  (:class:`~dyntta.methods.memory.PBRS`, capacity 64).
- Every ``update_every = 64`` samples the model trains one epoch on the memory in training mode:
  IABN shrinks towards the memory batch's statistics and moves its running statistics towards
  them with momentum 0.01, and Adam (lr 1e-4) steps the BN affine parameters on the entropy of
  the predictions, averaged over samples and classes alike (the code's ``HLoss``:
  ``mean(-p * log(p + 1e-6))`` over the (N, K) matrix). The memory fits in one batch (the
  code's CIFAR batch size is 128), so the epoch is one step and the order of the memory does not
  matter.

Source model: NOTE's published numbers use a source model trained with IABN layers (``--iabn``
during source training). Given a plain BN model, as here, this implementation turns every BN
layer into IABN around that layer's own running statistics and affine parameters, without any
retraining: IABN is applied post hoc, so numbers can differ from the paper's, which were
obtained with IABN-trained sources.

When an update falls inside a batch (the stream is not aligned to ``update_every``), the rest
of the batch is predicted with the updated model, as in the code's per-sample loop. Pseudo-labels
cross to the host once per chunk: the memory's decisions are sequential.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from dyntta.methods.adam import make_adam
from dyntta.methods.base import check_unit_interval
from dyntta.methods.gradient import GradientMethod, check_positive, norm_layers_training
from dyntta.methods.memory import PBRS, MemoryConfig, update_chunks
from dyntta.methods.registry import register
from dyntta.norm import InstanceAwareBatchNorm2d


@dataclasses.dataclass(frozen=True)
class NOTEConfig(MemoryConfig):
    """Hyper-parameters of NOTE (TaesikGong/NOTE ``tta.sh`` for ``METHOD=NOTE``; ``main.py``).

    lr: 1e-4, Adam with betas (0.9, 0.999), ``weight_decay=0`` (``tta.sh``: ``lr=0.0001``;
        ``learner/dnn.py`` builds Adam for every TTA method; kept instead of the DYN paper's
        shared SGD).
    memory_size: 64 (``--memory_size``).
    update_every: 64 samples between updates (``--update_every_x``).
    k: IABN's shrink width, 4 (``--iabn_k 4``).
    bn_momentum: 0.01, the running statistics' update rate during updates (``--bn_momentum``).
    skip_threshold: IABN skips feature maps with ``H * W <= 1`` (``--skip_thres`` default).
    temperature: 1.0, the entropy loss's softmax temperature (``--temperature`` default).
    seed: seeds PBRS's random replacements.
    """

    lr: float = 1e-4
    k: float = 4.0
    bn_momentum: float = 0.01
    skip_threshold: int = 1
    temperature: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if not self.k >= 0:
            raise ValueError(f"k must be >= 0 (shrink width in standard errors), got {self.k}")
        check_unit_interval("bn_momentum", self.bn_momentum)
        if self.skip_threshold < 1:
            raise ValueError(f"skip_threshold must be >= 1, got {self.skip_threshold}")
        check_positive("temperature", self.temperature)


@register
class NOTE(GradientMethod):
    """IABN, PBRS memory, entropy minimisation on the memory every 64 samples. Predicts each
    sample on its own (IABN around the running statistics): predictions do not depend on the
    batch size or on which samples share a batch, hence immune to mixed batches.

    Attributes (cleared by ``reset()``):
        memory: the :class:`PBRS` memory, created at the first batch (it needs the number of
            classes).
        seen: samples seen since the last reset.
    """

    name = "note"
    Config = NOTEConfig

    def make_norm_layer(self, bn: nn.BatchNorm2d) -> InstanceAwareBatchNorm2d:
        c = self.config
        return InstanceAwareBatchNorm2d(
            bn, k=c.k, reference="mode", momentum=c.bn_momentum, skip_threshold=c.skip_threshold
        )

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return make_adam(params, self.config.lr)

    def on_reset(self) -> None:
        super().on_reset()
        self.memory: PBRS | None = None
        self.seen = 0

    @torch.no_grad()
    def step(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        outputs = []
        for start, end, update_after in update_chunks(x.shape[0], self.seen, c.update_every):
            chunk = x[start:end]
            self.model.eval()
            logits = self.model(chunk)
            if self.memory is None:
                self.memory = PBRS(c.memory_size, logits.shape[1], c.seed)
            self.memory.add(chunk, logits.argmax(1).tolist())
            outputs.append(logits)
            self.seen += end - start
            if update_after:
                self.update()
        return torch.cat(outputs)

    @torch.enable_grad()
    def update(self) -> None:
        """One epoch (one batch) of entropy minimisation on the memory, its IABN layers in
        training mode (the code puts the whole model in training mode; the other layers stay
        in eval mode here, so a dropout layer does not drop during the update)."""
        with norm_layers_training(self.model):
            probs = (self.model(self.memory.images()) / self.config.temperature).softmax(1)
            self.descend(-(probs * torch.log(probs + 1e-6)).mean())
