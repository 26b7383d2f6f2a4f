"""DeYO: destroy your object (Lee et al., "Entropy is not Enough for Test-Time Adaptation: From
the Perspective of Disentangled Factors", ICLR 2024; code Jhyun17/DeYO ``methods/deyo.py``).

TENT's set-up (batch-statistics BN, SGD on the BN affine parameters). Per batch, with entropies
``E_i`` of the predictions:

1. entropy filter: keep ``E_i < tau_ent = margin * ln C`` (Eq. 8);
2. the kept images are destroyed as objects by shuffling their 4 x 4 grid of patches (a new
   random permutation per image) and predicted again, without gradient (the BN statistics are
   those of the kept, shuffled images, as in the code);
3. PLPD, the drop of the pseudo-label's probability, ``PLPD_i = p_i[y_i] - p'_i[y_i]`` with
   ``y_i = argmax p_i`` (Eq. 7); keep ``PLPD_i > tau_plpd`` (Eq. 8);
4. loss: the mean over the selected samples of ``E_i * (exp(Ent0 - E_i) + exp(PLPD_i))``, the
   weights detached, ``Ent0 = margin_e0 * ln C`` (Eq. 10).

No step is taken (momentum included) when a filter leaves no sample, as in the code. The
filtered forward needs the kept samples' indices (its BN statistics are over them only), so the
first filter crosses to the host; the second one is counted on the host to decide the step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from torch.nn import functional as F

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
class DeYOConfig(SGDConfig):
    """Hyper-parameters of DeYO (Jhyun17/DeYO ``config.py``, ``main.py``, ``exp_deyo.sh``).

    lr, momentum: 1e-4 (the DYN paper's shared setting; the code uses 2.5e-4 at batch 64 for
        ResNet-50) and 0.9 (``main.py``: ``SGD(params, lr, momentum=0.9)``, no Nesterov).
    margin: entropy threshold tau_ent as a fraction of ln C, 0.5 (``--deyo_margin``).
    margin_e0: Ent0 of the weighting as a fraction of ln C, 0.4 (``--deyo_margin_e0``).
    plpd_threshold: tau_plpd, 0.2 (``--plpd_threshold`` default and the "wild" settings of
        ``exp_deyo.sh``; its "mild" ResNet-50-BN run uses 0.3).
    patch_len: patches per image side for the shuffle, 4 (``--patch_len``; ``--aug_type patch``).
    frozen: names of child modules whose BN layers are not adapted, ``("layer4",)``, as the
        code's ``collect_params`` (a module is frozen when a component of its dotted name equals
        an entry; CIFAR ResNets have no ``layer4``).
    seed: seeds the patch permutations.

    ``PUBLISHED`` (the ``published`` benchmark protocol): ImageNet-C, the authors' run of a
    BN ResNet-50 (Jhyun17/DeYO ``exp_deyo.sh``: ``DTHR=0.3`` for its "normal" experiment;
    ``main.py``: lr 2.5e-4 at batch >= 32). The authors' code has no CIFAR setting; CIFAR-10-C
    and CIFAR-100-C take mariodoebler/test-time-adaptation's
    (``classification/cfgs/cifar10_c/deyo.yaml``: Adam lr 1e-3, the thresholds above).
    """

    margin: float = 0.5
    margin_e0: float = 0.4
    plpd_threshold: float = 0.2
    patch_len: int = 4
    frozen: tuple[str, ...] = ("layer4",)
    seed: int = 0

    PUBLISHED: ClassVar[dict[str, dict[str, Any]]] = {
        "cifar10": {"optimizer": "adam", "lr": 1e-3},
        "cifar100": {"optimizer": "adam", "lr": 1e-3},
        "imagenet": {"lr": 2.5e-4, "plpd_threshold": 0.3},
    }

    def __post_init__(self):
        super().__post_init__()
        check_positive("margin", self.margin)
        check_positive("margin_e0", self.margin_e0)
        if self.patch_len < 1:
            raise ValueError(f"patch_len must be >= 1, got {self.patch_len}")
        check_module_names("frozen", self.frozen)


def shuffle_patches(x: torch.Tensor, patch_len: int, generator: torch.Generator) -> torch.Tensor:
    """Cut every image of ``x: (B, C, H, W)`` into ``patch_len x patch_len`` patches and put them
    back in a random order (one permutation per image, drawn from ``generator``).

    When H or W is not a multiple of ``patch_len`` the images are resized (bilinear, antialiased)
    to the nearest smaller multiple first and back to (H, W) afterwards, as the code does with
    torchvision's ``Resize``; otherwise pixels are only moved.
    """
    b, c, h, w = x.shape
    p = patch_len
    ph, pw = h // p, w // p
    if ph == 0 or pw == 0:
        raise ValueError(f"images of size {h}x{w} are smaller than {p}x{p} patches")
    resized = (ph * p, pw * p) != (h, w)
    if resized:
        x = F.interpolate(x, size=(ph * p, pw * p), mode="bilinear", antialias=True)
    patches = x.reshape(b, c, p, ph, p, pw).permute(0, 2, 4, 1, 3, 5).reshape(b, p * p, c, ph, pw)
    order = torch.argsort(torch.rand(b, p * p, generator=generator), dim=1).to(x.device)
    patches = patches[torch.arange(b, device=x.device).unsqueeze(1), order]
    x = patches.reshape(b, p, p, c, ph, pw).permute(0, 3, 1, 4, 2, 5).reshape(b, c, ph * p, pw * p)
    if resized:
        x = F.interpolate(x, size=(h, w), mode="bilinear", antialias=True)
    return x


@register
class DeYO(GradientMethod):
    """Entropy minimisation on samples selected and weighted by entropy and PLPD.

    Attributes (cleared by ``reset()``):
        num_entropy_selected, num_selected: samples that passed the first / both filters.
    """

    name = "deyo"
    Config = DeYOConfig

    def on_reset(self) -> None:
        super().on_reset()
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.num_entropy_selected = 0
        self.num_selected = 0

    @torch.enable_grad()
    def step(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        logits = self.model(x)
        num_classes = logits.shape[1]
        entropy = softmax_entropy(logits)
        kept = torch.nonzero(entropy.detach() < entropy_margin(c.margin, num_classes)).squeeze(1)
        if kept.numel() == 0:
            return logits.detach()
        entropy = entropy[kept]
        probs = logits.detach()[kept].softmax(1)
        with torch.no_grad():
            shuffled = shuffle_patches(x[kept], c.patch_len, self.generator)
            probs_shuffled = self.model(shuffled).softmax(1)
        label = probs.argmax(1, keepdim=True)
        plpd = (probs.gather(1, label) - probs_shuffled.gather(1, label)).squeeze(1)
        selected = plpd > c.plpd_threshold
        weight = torch.exp(entropy_margin(c.margin_e0, num_classes) - entropy.detach())
        weight = weight + torch.exp(plpd)
        num_selected = int(selected.sum())
        self.num_entropy_selected += kept.numel()
        self.num_selected += num_selected
        if num_selected > 0:
            self.descend(masked_mean(entropy * weight, selected))
        return logits.detach()
