"""ViDA's visual domain adapters: a low-rank and a high-rank bottleneck beside a layer.

``y = layer(x) + scale_low * up(down(x)) + scale_high * up2(down2(x))`` where ``down`` maps to
``rank_low`` features and ``down2`` to ``rank_high`` features (ViDA, Liu et al., ICLR 2024,
Sec. 3.1; Yangsenqiao/vida ``inject_vida.py``: ``ViDAInjectedLinear``, ranks 1 and 128 in the
CIFAR config). The down-projections start normal with std ``1 / rank**2`` and the
up-projections at zero, as in the code, so a fresh adapter adds nothing: the wrapped model
computes exactly what the source model computes.

The released code injects adapters beside ``nn.Linear`` layers (of a ViT's attention blocks).
For convolutions, which the paper also adapts but whose code is not released, the adapter's
down-projection here is a convolution with the wrapped layer's kernel size, stride, padding and
dilation (so the branch sees the same receptive field and yields the same spatial size) and the
up-projection a 1 x 1 convolution, the usual low-rank form of a convolution.

The scales are 0-dim buffers, set by the method every batch without a host round trip.

Both branches are linear with no activation in between, so the sum is one layer of the wrapped
shape with weight ``W + scale_low * U1 D1 + scale_high * U2 D2``. The forward pass runs that
merged layer (for convolutions with ``groups=1`` and zero padding, and for linear layers): the
same function and, through autograd, the same gradients for every factor, at the cost of the
wrapped layer alone. Rank-128 branches beside 16-64-channel convolutions otherwise cost about ten
times the convolution itself (ViDA on a ResNet-26, batch of 64, 2 CPU threads: 10.5 s per batch
unmerged, 1.4 s merged; ``benchmarks/method_throughput.py``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import skip_init

ADAPTER_PREFIX = "vida_"
"""Names of the adapters' submodules start with this (the code's test for adapter parameters)."""


class ViDAAdapter(nn.Module):
    """A layer (``nn.Conv2d`` or ``nn.Linear``) with ViDA's two adapters beside it.

    Args:
        layer: the wrapped layer; its parameters are shared, not copied.
        rank_low, rank_high: widths of the low- and high-rank bottlenecks (1 and 128).
        generator: draws the down-projections' initial weights.

    Attributes:
        layer, vida_down, vida_up, vida_down2, vida_up2: the modules.
        scale_low, scale_high: 0-dim buffers, both 1 initially.
    """

    def __init__(
        self,
        layer: nn.Conv2d | nn.Linear,
        rank_low: int = 1,
        rank_high: int = 128,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if rank_low < 1 or rank_high < 1:
            raise ValueError(f"ViDA ranks must be >= 1, got {rank_low} and {rank_high}")
        self.layer = layer
        ref = layer.weight
        self.vida_down, self.vida_up = bottleneck(layer, rank_low)
        self.vida_down2, self.vida_up2 = bottleneck(layer, rank_high)
        with torch.no_grad():
            for down, up, rank in (
                (self.vida_down, self.vida_up, rank_low),
                (self.vida_down2, self.vida_up2, rank_high),
            ):
                noise = torch.randn(down.weight.shape, generator=generator, dtype=ref.dtype)
                down.weight.copy_(noise / rank**2)
                up.weight.zero_()
        self.register_buffer("scale_low", torch.ones((), dtype=ref.dtype, device=ref.device))
        self.register_buffer("scale_high", torch.ones((), dtype=ref.dtype, device=ref.device))

    @property
    def mergeable(self) -> bool:
        """Whether the forward pass runs the single merged layer (see the module doc)."""
        layer = self.layer
        return isinstance(layer, nn.Linear) or (
            layer.groups == 1 and layer.padding_mode == "zeros"
        )

    def merged_weight(self) -> torch.Tensor:
        """``W + scale_low * U1 D1 + scale_high * U2 D2`` in the wrapped layer's weight shape."""
        weight = self.layer.weight
        for down, up, scale in (
            (self.vida_down, self.vida_up, self.scale_low),
            (self.vida_down2, self.vida_up2, self.scale_high),
        ):
            rank = down.weight.shape[0]
            product = up.weight.reshape(-1, rank) @ down.weight.reshape(rank, -1)
            weight = weight + scale * product.view_as(weight)
        return weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        if not self.mergeable:
            low = self.vida_up(self.vida_down(x))
            high = self.vida_up2(self.vida_down2(x))
            return layer(x) + self.scale_low * low + self.scale_high * high
        if isinstance(layer, nn.Linear):
            return F.linear(x, self.merged_weight(), layer.bias)
        return F.conv2d(x, self.merged_weight(), layer.bias, layer.stride, layer.padding,
                        layer.dilation)


def bottleneck(layer: nn.Conv2d | nn.Linear, rank: int) -> tuple[nn.Module, nn.Module]:
    """Bias-free ``(down, up)`` projections through ``rank`` features beside ``layer``, on its
    device and dtype, weights left uninitialised (the caller sets them)."""
    where = {"device": layer.weight.device, "dtype": layer.weight.dtype}
    if isinstance(layer, nn.Linear):
        return (
            skip_init(nn.Linear, layer.in_features, rank, bias=False, **where),
            skip_init(nn.Linear, rank, layer.out_features, bias=False, **where),
        )
    down = skip_init(
        nn.Conv2d,
        layer.in_channels,
        rank,
        layer.kernel_size,
        layer.stride,
        layer.padding,
        layer.dilation,
        bias=False,
        padding_mode=layer.padding_mode,
        **where,
    )
    return down, skip_init(nn.Conv2d, rank, layer.out_channels, 1, bias=False, **where)


def inject_adapters(
    model: nn.Module, rank_low: int, rank_high: int, generator: torch.Generator | None = None
) -> int:
    """Wrap, in place, every ``nn.Conv2d`` and ``nn.Linear`` of ``model`` in a
    :class:`ViDAAdapter`; returns how many layers were wrapped.

    Raises:
        ValueError: the model has no such layer.
    """
    targets = [
        (parent, name, child)
        for parent in model.modules()
        if not isinstance(parent, ViDAAdapter)
        for name, child in parent.named_children()
        if isinstance(child, (nn.Conv2d, nn.Linear))
    ]
    if not targets:
        raise ValueError(
            f"{type(model).__name__} has no nn.Conv2d or nn.Linear layer to put ViDA "
            "adapters beside"
        )
    for parent, name, child in targets:
        setattr(parent, name, ViDAAdapter(child, rank_low, rank_high, generator))
    return len(targets)
