"""The layers of ``dyn_adaptive`` (beyond the DYN paper): BN statistics from a batch topped up
with the instance statistics of the samples seen just before it.

- :class:`WindowedNorm2d`: the window and what both layers share (the source mix, the
  instance rule, and the mark its owner sets on a batch of one domain, where that rule stops);
- :class:`NeighbourhoodNorm2d`: each sample takes the statistics of its ``n`` most similar
  samples (among the candidates its owner gives), the source weighted by that size; the last
  samples its owner marks as one domain are one group;
- :class:`PooledNorm2d`: one pool of the batch and the remembered samples a filter keeps (or,
  per sample, the candidates its owner gives among them), the source weighted by a weight its
  owner sets; the owner computes the filter's weights once per batch;
- :class:`PerCall`: a layer of its own for each call of a BN module that a forward runs more
  than once.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import torch
from torch import nn

from dyntta.norm.class_balance import ClassBalance
from dyntta.norm.layers import SourceNorm2d, compiled_here, mix
from dyntta.norm.mixing import bounded_mix, size_weight
from dyntta.norm.neighbours import nearest_neighbours
from dyntta.norm.stats import (
    instance_stats, neighbourhood_stats, shrink_mean, shrink_to_reference, spread_ratio,
    weighted_stats)
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
    None, through :func:`widened_instance_rule` with ``(k, c)`` over ``length`` > 1 positions."""
    mean, var = mix(running_mean, mean, weight), mix(running_var, var, weight)
    if k is not None:
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
    candidates: torch.Tensor | None,
    prior_strength: float,
    length: int,
    k: float | None,
    c: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`NeighbourhoodNorm2d`'s ``(mean, var)``: each sample's ``neighbours`` nearest in
    the pool (among its ``candidates`` rows, unless None), the source weighted ``N / (N + n)``,
    then the instance rule."""
    index = nearest_neighbours(pool_mu.detach(), neighbours, mu.shape[0], candidates)
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
    mean, var, spread = weighted_stats(pool_mu, pool_s2, (weight / weight.sum())[None])
    return source_mixed(mu, s2, mean[0], var[0], spread.expand(mu.shape[0], -1), source_weight,
                        running_mean, running_var, length, k, c, eps)


def one_domain_statistics(
    group_mu: torch.Tensor,
    group_s2: torch.Tensor,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    prior_strength: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A group of n samples of one domain: its mean ``m`` and variance ``v`` (of its pixels, by
    the law of total variance), each pulled towards the source's by the size weight
    ``N / (N + n)`` times its difference from it, but by at most that weight times the standard
    deviation of the members' instance means (for ``m``) or variances (for ``v``)
    (:func:`~dyntta.norm.mixing.bounded_mix`). Where the domain moved the statistics further
    than its samples spread (the digits' low contrast), the group keeps its own; near the
    source it is mixed as by :func:`pooled_statistics`.

    Args:
        group_mu, group_s2: (n, C) the members' instance means and variances.

    Returns:
        ``(mean, var)``, each (C,).
    """
    weight = size_weight(group_mu.shape[0], prior_strength)
    spread = group_mu.var(0, unbiased=False)
    mean = bounded_mix(running_mean, group_mu.mean(0), weight, spread.sqrt())
    var = bounded_mix(running_var, group_s2.mean(0) + spread, weight,
                      group_s2.std(0, unbiased=False))
    return mean, var


OFFSET_LEVEL = 0.05
"""The level of :func:`offset_channels`' test for a layer (Bonferroni over its channels)."""


@functools.lru_cache(maxsize=256)
def chi_square_quantile(probability: float, degrees: int) -> float:
    """The chi-square distribution's quantile (SciPy, imported on use: slow to import)."""
    from scipy.stats import chi2

    return float(chi2.ppf(probability, degrees))


def between_within(mu: torch.Tensor, s2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Of n images' (n, C) instance means and variances: per channel, the variance of the
    means between the images (biased, over n) and the mean variance within them."""
    return mu.var(0, unbiased=False), s2.mean(0)


def between_within_ratio(between: torch.Tensor, within: torch.Tensor) -> torch.Tensor:
    """``between / within`` (:func:`between_within`'s parts), a within of 0 read as the
    smallest positive value."""
    return between / within.clamp_min(torch.finfo(within.dtype).tiny)


def offset_channels(group_mu: torch.Tensor, group_s2: torch.Tensor,
                    source_ratio: torch.Tensor) -> torch.Tensor:
    """(C,) bool: the channels in which a group of n images of one domain spreads its instance
    means further apart, against the spread within its images, than the source does.

    Per channel, the group's ratio of the between- to the within-image variance
    (:func:`between_within`) over the source's ``source_ratio`` (read on clean images) is
    tested against the chi-square quantile of a variance of n normal means,
    ``chi2(1 - OFFSET_LEVEL / C, n - 1) / (n - 1)``: 5% for the layer, Bonferroni over its C
    channels. Low contrast, for one, shrinks the spread within each image and not that of the
    images' means, and a group's statistics then leave each image offset by its own mean.

    Args:
        group_mu, group_s2: (n, C) the members' instance means and variances, n >= 2.
        source_ratio: (C,) the source's ratio.
    """
    n, channels = group_mu.shape
    ratio = between_within_ratio(*between_within(group_mu, group_s2))
    bar = chi_square_quantile(1.0 - OFFSET_LEVEL / channels, n - 1) / (n - 1)
    return ratio > source_ratio * bar


def own_offsets(mu: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
                flagged: torch.Tensor, length: int, k: float, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample, in the ``flagged`` channels, NOTE's instance-aware rule on the mean
    (:func:`~dyntta.norm.stats.shrink_mean`, ``k`` standard errors of ``var`` over ``length``
    positions) around the group's (C,) ``mean``; elsewhere ``mean``. Returns the (B, C) means
    and ``var`` given to every sample."""
    own = shrink_mean(mu, mean, var, length, k, eps)
    return torch.where(flagged, own, mean.expand_as(mu)), var.expand_as(mu).contiguous()


def pool_of(mu: torch.Tensor, s2: torch.Tensor, window_mean: torch.Tensor | None,
            window_var: torch.Tensor | None, n_window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's (B, C) instance statistics after the last ``n_window`` remembered ones."""
    if not n_window:
        return mu, s2
    return torch.cat([window_mean[-n_window:], mu]), torch.cat([window_var[-n_window:], s2])


def next_window(pool_mu: torch.Tensor, pool_s2: torch.Tensor, window: int, n_window: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool's last ``window`` rows (all of them for ``window`` 0): with ``n_window``
    remembered rows, the whole pool, put together here (of at most ``window`` rows, as
    :meth:`WindowedNorm2d.n_window` gives); without, the batch's, copied (an operator's output
    may not be a view of its input)."""
    if n_window:
        return pool_mu.detach(), pool_s2.detach()
    return pool_mu.detach()[-window:].clone(), pool_s2.detach()[-window:].clone()


def pooled_per_sample(candidates: torch.Tensor | None, k: float | None) -> bool:
    """Whether :class:`PooledNorm2d`'s traced operator gives (B, C) statistics rather than (C,):
    each sample has its own group (``candidates``), or the instance rule may apply (``k``)."""
    return candidates is not None or k is not None


def _neighbourhood_operator(
    mu: torch.Tensor, s2: torch.Tensor, window_mean: torch.Tensor | None,
    window_var: torch.Tensor | None, n_window: int, window: int, domain_rows: torch.Tensor,
    running_mean: torch.Tensor, running_var: torch.Tensor, neighbours: int,
    candidates: torch.Tensor | None, prior_strength: float, length: int, k: float | None,
    c: float, eps: float, source_ratio: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    pool_mu, pool_s2 = pool_of(mu, s2, window_mean, window_var, n_window)
    rows = int(domain_rows)
    if rows and k is not None:  # one group; the pull bounded (NeighbourhoodNorm2d's docstring)
        group_mu, group_s2 = pool_mu[-rows:], pool_s2[-rows:]
        mean, var = one_domain_statistics(group_mu, group_s2, running_mean, running_var,
                                          prior_strength)
        if source_ratio is not None and rows > 1:
            flagged = offset_channels(group_mu, group_s2, source_ratio)
            mean, var = own_offsets(mu, mean, var, flagged, length, k, eps)
    elif rows:  # the pool's last rows as one group of n, the source weighted N / (N + n); no
        # instance rule (WindowedNorm2d's docstring)
        group_mu, group_s2 = pool_mu[-rows:], pool_s2[-rows:]
        mean, var = pooled_statistics(
            mu, s2, group_mu, group_s2, mu.new_ones(group_mu.shape[0]), running_mean,
            running_var, size_weight(group_mu.shape[0], prior_strength), length, None, c, eps)
    else:
        mean, var = neighbourhood_statistics(mu, s2, pool_mu, pool_s2, running_mean,
                                             running_var, neighbours, candidates,
                                             prior_strength, length, k, c, eps)
    return mean, var, *next_window(pool_mu, pool_s2, window, n_window)


def _pooled_operator(
    mu: torch.Tensor, s2: torch.Tensor, window_mean: torch.Tensor | None,
    window_var: torch.Tensor | None, n_window: int, window: int, domain_rows: torch.Tensor,
    weight: torch.Tensor, candidates: torch.Tensor | None, running_mean: torch.Tensor,
    running_var: torch.Tensor, source_weight: torch.Tensor, length: int, k: float | None,
    c: float, eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    pool_mu, pool_s2 = pool_of(mu, s2, window_mean, window_var, n_window)
    rule = None if int(domain_rows) else k  # one domain: none (WindowedNorm2d's docstring)
    if candidates is None:
        mean, var = pooled_statistics(mu, s2, pool_mu, pool_s2, weight, running_mean,
                                      running_var, source_weight, length, rule, c, eps)
    else:  # each sample's group: its candidate rows, equally weighted
        groups = pool_mu.new_zeros(mu.shape[0], pool_mu.shape[0])
        groups.scatter_(1, candidates, 1.0 / candidates.shape[1])
        mean, var, spread = weighted_stats(pool_mu, pool_s2, groups)
        mean, var = source_mixed(mu, s2, mean, var, spread, source_weight, running_mean,
                                 running_var, length, rule, c, eps)
    return mean, var, *next_window(pool_mu, pool_s2, window, n_window)


def _fake_outputs(mu, n_window, window, per_sample):
    rows = n_window + mu.shape[0]
    rows = min(window, rows) if window else rows
    shape = mu.shape if per_sample else mu.shape[1:]
    return (mu.new_empty(shape), mu.new_empty(shape), mu.new_empty(rows, mu.shape[1]),
            mu.new_empty(rows, mu.shape[1]))


def traced(name: str, operator: Callable, per_sample: Callable[..., bool]):
    """``operator`` as one operator of a ``torch.compile`` graph, whose outputs have one shape
    whatever the data: where ``per_sample(**arguments)``, a group's (C,) statistics are given to
    each of the batch's B samples (copied; an operator's output is not a view). Eager, a layer
    calls ``operator`` itself and normalises a group's batch with its one row.

    No autograd (dyn_adaptive takes no gradient): inductor compiles the instance statistics and
    the normalisation around it, not the window, the neighbour search, the group statistics, the
    mix or the rule of every layer. Never captured in a CUDA graph: it reads on the host which
    rows are one domain and takes its branch by it, which a graph's replay would not."""
    names = list(inspect.signature(operator).parameters)

    @functools.wraps(operator)
    def fixed_shapes(*arguments):
        mean, var, window_mean, window_var = operator(*arguments)
        if mean.ndim == 1 and per_sample(**dict(zip(names, arguments))):
            mean, var = mean.expand_as(arguments[0]).clone(), var.expand_as(arguments[0]).clone()
        return mean, var, window_mean, window_var

    def fake(*arguments):
        named = dict(zip(names, arguments))
        return _fake_outputs(named["mu"], named["n_window"], named["window"], per_sample(**named))

    op = torch.library.custom_op(name, mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))(
        fixed_shapes)
    op.register_fake(fake)
    return op


# Each returns the layer's statistics and its next window (the pool's last ``window`` rows; all
# of them for a layer without one).
traced_neighbourhood = traced("dyntta::neighbourhood_statistics", _neighbourhood_operator,
                              lambda **_arguments: True)
traced_pooled = traced("dyntta::pooled_statistics", _pooled_operator,
                       lambda candidates, k, **_arguments: pooled_per_sample(candidates, k))


class WindowedNorm2d(SourceNorm2d):
    """Base: the batch's instance statistics topped up with those of the last samples seen.

    A batch of B samples is joined by the ``max(0, window - B)`` most recent remembered ones
    (instance means and variances, no feature maps), so every statistic comes from at least
    ``window`` samples and a batch of ``window`` or more is unchanged by it. Subclasses group the
    pool (their operator, :meth:`arguments`); the group's statistics are mixed with the source's
    at the weight the subclass gives, then, with ``instance=(k, c)``, pass
    :func:`widened_instance_rule`, except while the 0-dim integer tensor ``domain_rows`` is
    r > 0 (set by its owner before a batch: the last r samples, the batch's and those remembered
    before it, are one domain; not saved): within one domain a sample's statistics leave the
    group's by its content, not its domain, so no sample keeps its own.
    Normalises in the fused kernel (:func:`~dyntta.norm.normalize`): eager, a group's batch with
    its one (C,) row (compiled, the traced operator gives that row to every sample, :func:`traced`).

    Its owner, which runs it once per forward, sets ``calls`` to 0 before each forward; a
    second call in that forward then raises.

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
        self.calls: int | None = None  # in this forward, counted once its owner sets it to 0
        # on the host, not a buffer: it stays there when the model moves to a device, so that
        # reading it waits for no queued kernel; a tensor, so a compiled graph reads its value
        self.domain_rows = torch.tensor(0)
        self.reset_window()

    def reset_window(self) -> None:
        """Forget the remembered samples."""
        self.window_mean: torch.Tensor | None = None
        self.window_var: torch.Tensor | None = None

    def arguments(self, mu: torch.Tensor, n_window: int, length: int) -> tuple:
        """The subclass operator's arguments after ``(mu, s2, window_mean, window_var,
        n_window, window)``."""
        raise NotImplementedError

    def n_window(self, batch_size: int) -> int:
        """How many remembered samples top up a batch of ``batch_size``: the pool is the last
        ``n_window`` of them, then the batch."""
        remembered = 0 if self.window_mean is None else self.window_mean.shape[0]
        return min(max(0, self.window - batch_size), remembered)

    def statistics(self, x):
        if not torch.compiler.is_compiling() and self.calls is not None:
            self.calls += 1
            if self.calls > 1:  # a second call would read and record the first one's window
                raise ValueError("this BN module ran more than once in one forward; the first "
                                 "batch ran it once")
        mu, s2 = instance_stats(x)
        n_window = self.n_window(x.shape[0])
        operator = self.traced_operator if compiled_here(mu) else self.operator
        mean, var, window_mean, window_var = operator(
            mu, s2, self.window_mean, self.window_var, n_window, self.window,
            *self.arguments(mu, n_window, x.shape[2] * x.shape[3]))
        if self.window:
            self.window_mean, self.window_var = window_mean, window_var
        return mean, var

    def rule(self, length: int) -> tuple[float | None, float]:
        """``(k, c)`` of the instance rule on maps of ``length`` positions; ``(None, 0.0)``
        without it or on a 1x1 map, whose instance variances are 0 (no rule, no bound by them).
        """
        return self.instance if self.instance is not None and length > 1 else (None, 0.0)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}, instance={self.instance}"


class NeighbourhoodNorm2d(WindowedNorm2d):
    """Each sample's statistics are those of its ``n`` nearest samples in the pool (itself
    included; LISC's cosine similarity of instance means, :mod:`~dyntta.norm.neighbours`), mixed
    with the source at Schneider et al.'s weight ``N / (N + n)`` (NeurIPS 2020, Eq. 3). While
    ``domain_rows`` is r > 0, the pool's last r rows (as many as it holds) are one group of n
    instead, the source weighted ``N / (N + n)`` (:func:`pooled_statistics`), its pull bounded by
    the members' spread in a layer with the instance rule (:func:`one_domain_statistics`; as that
    rule, not on 1x1 maps, whose instance variances are 0); the window records the batch either
    way.
    The buffer ``candidates``, None or (B, K) indices into the pool that its owner sets before a
    batch (not saved), narrows each sample's search to its K candidate rows. The buffer
    ``source_ratio``, None or the (C,) ratio of the between- to the within-image variance of the
    source's clean images (its owner sets it; not saved by the layer): in a layer with the
    instance rule, the channels in which a group of one domain spreads its images' means
    further than that (:func:`offset_channels`) give each sample its own mean by that rule
    (:func:`own_offsets`).

    Args:
        neighbours: n >= 1.
        prior_strength: N > 0, the source's weight in samples.
    """

    def __init__(self, bn: nn.BatchNorm2d, window: int, neighbours: int, prior_strength: float,
                 instance: tuple[float, float] | None = None) -> None:
        super().__init__(bn, window, instance)
        if neighbours < 1:
            raise ValueError(f"neighbours must be >= 1 (samples), got {neighbours}")
        if not prior_strength > 0:
            raise ValueError(f"prior_strength must be > 0 (samples), got {prior_strength}")
        self.neighbours = neighbours
        self.prior_strength = prior_strength
        self.register_buffer("candidates", None, persistent=False)
        self.register_buffer("source_ratio", None, persistent=False)

    operator = staticmethod(_neighbourhood_operator)
    traced_operator = traced_neighbourhood

    def arguments(self, mu, n_window, length):
        return (self.domain_rows, self.running_mean, self.running_var, self.neighbours,
                self.candidates, self.prior_strength, length, *self.rule(length), self.eps,
                self.source_ratio)


class PooledNorm2d(WindowedNorm2d):
    """One group: the batch and the remembered samples, mixed with the source at the 0-dim
    buffer ``source_weight`` (not saved: its owner sets it before each batch; a buffer, so
    compiled code reads its current value). Its owner may set, before a batch (not saved):

    - ``pool_weight``: None (every row counts) or the (n_window + B,) weights of the pool's
      rows, 1 for those a filter keeps and 0 for the others (:meth:`filter_weights`);
    - ``candidates``: None, or (B, K) indices into the pool of kept rows: each sample's group
      is its K candidate rows instead.

    Both are computed once per batch for every pooled layer, outside the network's graph.

    Args:
        source_weight: the initial weight.
    """

    def __init__(self, bn: nn.BatchNorm2d, window: int, source_weight: float,
                 instance: tuple[float, float] | None = None) -> None:
        super().__init__(bn, window, instance)
        self.register_buffer("source_weight", torch.tensor(float(source_weight)),
                             persistent=False)
        self.register_buffer("pool_weight", None, persistent=False)
        self.register_buffer("candidates", None, persistent=False)

    def filter_weights(self, keep: WindowMatch | ClassBalance, batch_size: int) -> torch.Tensor:
        """The ``pool_weight`` of a batch of ``batch_size``: 1 for the batch and the remembered
        rows the filter ``keep`` keeps (``keep.keep(n_window, batch_size)``), 0 for the
        others (no data-dependent shape to compile)."""
        n_window = self.n_window(batch_size)
        ones = torch.ones(batch_size, dtype=torch.bool, device=self.running_mean.device)
        kept = keep.keep(n_window, batch_size) if n_window else ones[:0]
        return torch.cat([kept, ones]).to(self.running_mean.dtype)

    operator = staticmethod(_pooled_operator)
    traced_operator = traced_pooled

    def arguments(self, mu, n_window, length):
        rows = n_window + mu.shape[0]
        weight = self.pool_weight
        if weight is None:
            weight = mu.new_ones(rows)
        elif weight.shape[0] != rows:
            raise ValueError(f"pool_weight has {weight.shape[0]} rows; the pool of this batch "
                             f"has {rows} (its owner set it for another batch)")
        return (self.domain_rows, weight, self.candidates, self.running_mean, self.running_var,
                self.source_weight, length, *self.rule(length), self.eps)


class PerCall(nn.Module):
    """The layers of a BN module that a forward runs several times (e.g. one backbone applied to
    two views of the images): the i-th call of a forward goes to ``layers[i]``, each with its
    own role and window. Its owner sets ``call`` to 0 before each forward."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.call = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.call >= len(self.layers):
            raise ValueError(f"this BN module ran {self.call + 1} times in one forward; the "
                             f"first batch ran it {len(self.layers)} times")
        layer = self.layers[self.call]
        self.call += 1
        return layer(x)
