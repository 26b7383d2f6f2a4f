"""The layers of ``dyn_adaptive`` (beyond the DYN paper): BN statistics from a batch topped up
with the instance statistics of the samples seen just before it.

- :class:`WindowedNorm2d`: the window and what both layers share (the source mix and the
  instance rule);
- :class:`NeighbourhoodNorm2d`: each sample takes the statistics of its ``n`` most similar
  samples, the source weighted by that size;
- :class:`PooledNorm2d`: one pool of the batch and the remembered samples a filter keeps, the
  source weighted by a weight its owner sets.
"""

from __future__ import annotations

import torch
from torch import nn

from dyntta.norm.class_balance import ClassBalance
from dyntta.norm.layers import SourceNorm2d, mix
from dyntta.norm.mixing import size_weight
from dyntta.norm.neighbours import nearest_neighbours
from dyntta.norm.stats import instance_stats, neighbourhood_stats, shrink_to_reference, spread_ratio
from dyntta.norm.window_match import WindowMatch


def widened_instance_rule(
    mu: torch.Tensor,
    s2: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    spread: torch.Tensor,
    length: int,
    k: float,
    c: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NOTE's instance-aware rule (:func:`~dyntta.norm.stats.shrink_to_reference`) around
    ``mean``/``var`` with a band of ``max(k, c * sqrt(rho_c))`` standard errors per channel.

    ``rho_c`` (:func:`~dyntta.norm.stats.spread_ratio`) is the observed ``spread`` of instance
    means around each sample's group in units of the squared standard error IABN assumes for
    independent positions. Where positions are correlated (natural images) the band becomes
    ``c`` observed standard deviations, so only outliers keep their own statistics; where
    ``rho`` is small it stays ``k``.

    Args:
        mu, s2: (B, C) instance means and unbiased variances over ``length`` > 1 positions.
        mean, var: (C,) or (B, C) the statistics to shrink towards.
        spread: (B, C) variance of the instance means in each sample's group.
    """
    rho = spread_ratio(spread.detach(), s2.detach(), length, eps)
    band = torch.clamp(c * rho.sqrt(), min=k)
    return shrink_to_reference(mu, s2, mean, var, length, band, eps)


def source_mixed(
    mu: torch.Tensor,
    s2: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    spread: torch.Tensor,
    weight: float | torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    length: int,
    k: float | None,
    c: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A group's ``mean``/``var`` mixed with the source's at ``weight``, then, unless ``k`` is
    None or the map is 1x1, through :func:`widened_instance_rule` with ``(k, c)``."""
    mean, var = mix(running_mean, mean, weight), mix(running_var, var, weight)
    if k is not None and length > 1:
        mean, var = widened_instance_rule(mu, s2, mean, var, spread, length, k, c, eps)
    return mean, var


def neighbourhood_statistics(
    mu: torch.Tensor,
    s2: torch.Tensor,
    pool_mu: torch.Tensor,
    pool_s2: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    neighbours: int,
    prior_strength: float,
    length: int,
    k: float | None,
    c: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`NeighbourhoodNorm2d`'s ``(mean, var)``: each sample's ``neighbours`` nearest in
    the pool, the source weighted ``N / (N + n)``, then the instance rule."""
    index = nearest_neighbours(pool_mu.detach(), neighbours, mu.shape[0])
    mean, var, spread = neighbourhood_stats(pool_mu, pool_s2, index)
    return source_mixed(mu, s2, mean, var, spread, size_weight(index.shape[1], prior_strength),
                        running_mean, running_var, length, k, c, eps)


def pooled_statistics(
    mu: torch.Tensor,
    s2: torch.Tensor,
    pool_mu: torch.Tensor,
    pool_s2: torch.Tensor,
    weight: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    source_weight: torch.Tensor,
    length: int,
    k: float | None,
    c: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`PooledNorm2d`'s ``(mean, var)``: the pool's rows weighted by ``weight`` (P,) as
    one group, the source weighted ``source_weight``, then the instance rule."""
    size = weight.sum()
    mean = weight @ pool_mu / size
    deviation = (pool_mu - mean).square()
    var = weight @ (pool_s2 + deviation) / size
    spread = (weight @ deviation.detach() / size).expand(mu.shape[0], -1)
    return source_mixed(mu, s2, mean, var, spread, source_weight, running_mean, running_var,
                        length, k, c, eps)


def _fake_neighbourhood_statistics(mu, *_args):
    return torch.empty_like(mu), torch.empty_like(mu)


def _fake_pooled_statistics(mu, s2, pool_mu, pool_s2, weight, running_mean, running_var,
                            source_weight, length, k, c, eps):
    shape = mu.shape if k is not None and length > 1 else mu.shape[1:]  # (C,) without the rule
    return mu.new_empty(shape), mu.new_empty(shape)


# One operator each in a ``torch.compile`` graph (no autograd: dyn_adaptive takes no gradient):
# inductor compiles the instance statistics, the windows and the normalisation around them, not
# the neighbour search, the group statistics, the mix or the rule of every layer.
traced_neighbourhood_statistics = torch.library.custom_op(
    "dyntta::neighbourhood_statistics", mutates_args=())(neighbourhood_statistics)
traced_neighbourhood_statistics.register_fake(_fake_neighbourhood_statistics)
traced_pooled_statistics = torch.library.custom_op(
    "dyntta::pooled_statistics", mutates_args=())(pooled_statistics)
traced_pooled_statistics.register_fake(_fake_pooled_statistics)


def compiled_here(*tensors: torch.Tensor) -> bool:
    """Whether a graph is being compiled that takes no gradient through ``tensors``."""
    return torch.compiler.is_compiling() and not (
        torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


class WindowedNorm2d(SourceNorm2d):
    """Base: the batch's instance statistics topped up with those of the last samples seen.

    A batch of B samples is joined by the ``max(0, window - B)`` most recent remembered ones
    (instance means and variances, no feature maps), so every statistic comes from at least
    ``window`` samples and a batch of ``window`` or more is unchanged by it. Subclasses group the
    pool (:meth:`group`); the group's statistics are mixed with the source's at the weight the
    subclass gives, then, with ``instance=(k, c)``, pass :func:`widened_instance_rule`.
    Normalises in the fused kernel (:func:`~dyntta.norm.normalize`).

    Args:
        bn: the source BatchNorm2d.
        window: W >= 0 samples to remember. Stateful: :meth:`reset_window` empties it.
        instance: None, or ``(k, c)`` of :func:`widened_instance_rule`; 1x1 maps skip it.
    """

    fused = True

    def __init__(self, bn: nn.BatchNorm2d, window: int,
                 instance: tuple[float, float] | None = None) -> None:
        super().__init__(bn)
        if window < 0:
            raise ValueError(f"window must be >= 0 (samples), got {window}")
        self.window = window
        self.instance = instance
        self.reset_window()

    def reset_window(self) -> None:
        """Forget the remembered samples."""
        self.window_mean: torch.Tensor | None = None
        self.window_var: torch.Tensor | None = None

    def mixed(self, mu: torch.Tensor, s2: torch.Tensor, pool_mu: torch.Tensor,
              pool_s2: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, var)`` for the batch's (B, C) instance statistics ``mu``, ``s2`` from the
        pool's (P, C) statistics (the batch last): the group's, mixed with the source, through
        the instance rule."""
        raise NotImplementedError

    def statistics(self, x):
        mu, s2 = instance_stats(x)
        pool_mu, pool_s2 = mu, s2
        extra = max(0, self.window - x.shape[0])
        if extra and self.window_mean is not None:
            pool_mu = torch.cat([self.window_mean[-extra:], mu])
            pool_s2 = torch.cat([self.window_var[-extra:], s2])
        mean, var = self.mixed(mu, s2, pool_mu, pool_s2, x.shape[2] * x.shape[3])
        if self.window:
            self.window_mean = pool_mu.detach()[-self.window :]
            self.window_var = pool_s2.detach()[-self.window :]
        return mean, var

    def rule(self) -> tuple[float | None, float]:
        """``(k, c)`` of the instance rule; ``(None, 0.0)`` without it."""
        return self.instance if self.instance is not None else (None, 0.0)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}, instance={self.instance}"


class NeighbourhoodNorm2d(WindowedNorm2d):
    """Each sample's statistics are those of its ``n`` nearest samples in the pool (itself
    included; LISC's cosine similarity of instance means, :mod:`~dyntta.norm.neighbours`), mixed
    with the source at Schneider et al.'s weight ``N / (N + n)`` (NeurIPS 2020, Eq. 3).

    Args:
        neighbours: n >= 1.
        prior_strength: N > 0, the source's weight in samples.
        signature: None, or a :class:`~dyntta.norm.WindowMatch` this layer writes the batch's
            instance means into, every forward.
    """

    def __init__(self, bn: nn.BatchNorm2d, window: int, neighbours: int, prior_strength: float,
                 instance: tuple[float, float] | None = None,
                 signature: WindowMatch | None = None) -> None:
        super().__init__(bn, window, instance)
        if neighbours < 1:
            raise ValueError(f"neighbours must be >= 1 (samples), got {neighbours}")
        if not prior_strength > 0:
            raise ValueError(f"prior_strength must be > 0 (samples), got {prior_strength}")
        self.neighbours = neighbours
        self.prior_strength = prior_strength
        self.signature = signature

    def mixed(self, mu, s2, pool_mu, pool_s2, length):
        if self.signature is not None:
            self.signature.observe(mu)
        statistics = traced_neighbourhood_statistics if compiled_here(mu, pool_mu) \
            else neighbourhood_statistics
        return statistics(mu, s2, pool_mu, pool_s2, self.running_mean, self.running_var,
                          self.neighbours, self.prior_strength, length, *self.rule(), self.eps)


class PooledNorm2d(WindowedNorm2d):
    """One group: the batch and the remembered samples ``keep`` keeps, mixed with the source at
    the 0-dim buffer ``source_weight`` (not saved: its owner sets it before each batch; a
    buffer, so compiled code reads its current value).

    Args:
        keep: None (keep every remembered sample) or a filter whose ``keep(n_window, batch)``
            says which (:class:`~dyntta.norm.WindowMatch`, :class:`~dyntta.norm.ClassBalance`).
        source_weight: the initial weight.
    """

    def __init__(self, bn: nn.BatchNorm2d, window: int, source_weight: float,
                 instance: tuple[float, float] | None = None,
                 keep: WindowMatch | ClassBalance | None = None) -> None:
        super().__init__(bn, window, instance)
        self.keep = keep
        self.register_buffer("source_weight", torch.tensor(float(source_weight)),
                             persistent=False)

    def mixed(self, mu, s2, pool_mu, pool_s2, length):
        b = mu.shape[0]
        weight = pool_mu.new_ones(pool_mu.shape[0])
        if self.keep is not None and pool_mu.shape[0] > b:
            # dropped rows weigh 0: no data-dependent shape to compile
            kept = self.keep.keep(pool_mu.shape[0] - b, b)
            weight = torch.cat([kept, kept.new_ones(b)]).to(pool_mu.dtype)
        statistics = traced_pooled_statistics if compiled_here(mu, pool_mu) \
            else pooled_statistics
        return statistics(mu, s2, pool_mu, pool_s2, weight, self.running_mean, self.running_var,
                          self.source_weight, length, *self.rule(), self.eps)
