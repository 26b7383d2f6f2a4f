"""The layers of dyn_adaptive (beyond the paper) against direct readings of their rules, and
their limiting cases."""

from __future__ import annotations

import functools
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dyntta.norm.adaptive import (
    NeighbourhoodNorm2d, PooledNorm2d, offset_channels, traced_neighbourhood, traced_pooled,
    widened_instance_rule)
from dyntta.norm.layers import normalize
from dyntta.norm.mixing import bounded_mix, label_balance_weight, size_weight
from dyntta.norm.stats import spread_ratio
from tests.norm.test_layers import mixed_batch, source_bn


def iabn_reference(mu, s2, ref_mean, ref_var, length, k, eps):
    """IABN's rule written out: soft-shrink by k standard errors of the reference."""
    sd = (ref_var + eps).sqrt()
    d_mu, d_var = mu - ref_mean, s2 - ref_var
    t_mu, t_var = k * sd / length**0.5, k * sd**2 * (2 / (length - 1)) ** 0.5
    mean = ref_mean + torch.sign(d_mu) * (d_mu.abs() - t_mu).clamp_min(0)
    return mean, (ref_var + torch.sign(d_var) * (d_var.abs() - t_var).clamp_min(0)).clamp_min(0)


def groups_of(x, neighbours, candidates=None):
    """Each sample's group, written out: its ``neighbours`` most cosine-similar samples (among
    its row of ``candidates``, unless None; None neighbours: the whole batch)."""
    mu = x.mean((2, 3))
    if neighbours is None:
        return [torch.arange(x.shape[0])] * x.shape[0]
    unit = mu / mu.norm(dim=1, keepdim=True)
    if candidates is None:
        candidates = [torch.arange(x.shape[0])] * x.shape[0]
    return [c[(unit[c] @ unit[i]).argsort(descending=True)[:neighbours]]
            for i, c in enumerate(candidates)]


def group_reference(x, bn, neighbours, a, candidates=None):
    """Per sample: its group's pixels' mean and variance (instance variances unbiased), mixed
    with the source at weight ``a``."""
    mu, s2 = x.mean((2, 3)), x.var((2, 3))
    groups = groups_of(x, neighbours, candidates)
    mean = torch.stack([mu[g].mean(0) for g in groups])
    var = torch.stack([s2[g].mean(0) + mu[g].var(0, unbiased=False) for g in groups])
    return a * bn.running_mean + (1 - a) * mean, a * bn.running_var + (1 - a) * var


def test_size_weight_is_schneiders_prior():
    sizes = torch.tensor([[1.0], [4.0], [64.0]])
    torch.testing.assert_close(size_weight(sizes, 16.0), 16.0 / (16.0 + sizes))


@pytest.mark.parametrize("n", [1, 3, 10])
def test_neighbourhood_layer_is_the_n_nearest_samples_at_the_size_weight(n):
    bn = source_bn().double()
    x = mixed_batch(b=10)
    layer = NeighbourhoodNorm2d(bn, window=0, neighbours=n, prior_strength=4.0).double()
    mean, var = group_reference(x, bn, n, 4.0 / (4.0 + n))
    got = layer.statistics(x)
    torch.testing.assert_close(got[0], mean)
    torch.testing.assert_close(got[1], var)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_neighbourhood_layer_searches_each_sample_s_candidates_only(n):
    """With ``candidates`` set, each sample's n nearest are chosen among its own K rows."""
    bn = source_bn().double()
    x = mixed_batch(b=10)
    layer = NeighbourhoodNorm2d(bn, window=0, neighbours=n, prior_strength=4.0).double()
    candidates = torch.stack([torch.randperm(10, generator=torch.Generator().manual_seed(i))[:5]
                              for i in range(10)])
    layer.candidates = candidates
    mean, var = group_reference(x, bn, n, 4.0 / (4.0 + n), list(candidates))
    got = layer.statistics(x)
    torch.testing.assert_close(got[0], mean)
    torch.testing.assert_close(got[1], var)
    layer.candidates = torch.arange(10).expand(10, 10)  # every row: as without candidates
    everyone = group_reference(x, bn, n, 4.0 / (4.0 + n))
    torch.testing.assert_close(layer.statistics(x)[0], everyone[0])


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("rows", [4, 7, 30])
def test_neighbourhood_layer_set_to_one_domain_takes_its_last_rows_at_the_size_weight(n, rows):
    """The last ``rows`` samples (the batch of 4 and, beyond it, the most recent remembered
    ones, as many as the window holds) are one group."""
    bn = source_bn().double()
    x = mixed_batch(b=10)
    layer = NeighbourhoodNorm2d(bn, window=16, neighbours=n, prior_strength=4.0).double()
    layer(x[:6])  # remembered samples
    layer.domain_rows.fill_(rows)
    group = x[max(0, 10 - rows) :]
    mean, var = group_reference(group, bn, None, 4.0 / (4.0 + group.shape[0]))
    got = layer.statistics(x[6:])
    assert got[0].shape == got[1].shape == (x.shape[1],)  # one row for the whole batch
    torch.testing.assert_close(got[0].expand(4, -1), mean[-4:])
    torch.testing.assert_close(got[1].expand(4, -1), var[-4:])
    torch.testing.assert_close(layer.window_mean, x.mean((2, 3)))  # the window records it
    layer.domain_rows.fill_(0)  # neighbourhoods again
    assert not torch.allclose(layer.statistics(x[6:])[0], mean[-4:])
    assert "domain_rows" not in layer.state_dict()  # its owner's, set before each batch


def bounded_reference(group, bn, a):
    """A group's pixels' mean and variance, each moved towards the source's by ``a`` times
    their difference where that is within one standard deviation of the members' instance
    means (variances), else by ``a`` times that deviation, towards the source."""
    mu, s2 = group.mean((2, 3)), group.var((2, 3))
    own = (mu.mean(0), s2.mean(0) + mu.var(0, unbiased=False))
    out = []
    for value, source, sd in zip(own, (bn.running_mean, bn.running_var),
                                 (mu.std(0, unbiased=False), s2.std(0, unbiased=False))):
        d = value - source
        pull = torch.where(d.abs() <= sd, a * d, a * sd * torch.sign(d))
        out.append(value - pull)
    return out


@pytest.mark.parametrize("rows", [4, 7, 30])
def test_neighbourhood_layer_with_the_instance_rule_bounds_the_source_pull_on_one_domain(rows):
    """With the instance rule, a group of one domain keeps its own statistics but for at most
    the size weight times its members' spread towards the source's: unchanged where the
    source lies within that spread (half the channels here), bounded where it lies far."""
    bn = source_bn().double()
    x = mixed_batch(b=10)
    group = x[max(0, 10 - rows) :]
    mu, s2 = group.mean((2, 3)), group.var((2, 3))
    far = torch.arange(6) % 2 == 0  # the source far from the group on these channels
    bn.running_mean.copy_(torch.where(far, mu.mean(0) + 10, mu.mean(0) + 0.1 * mu.std(0)))
    bn.running_var.copy_(torch.where(far, s2.mean(0) * 20, s2.mean(0)))
    layer = NeighbourhoodNorm2d(bn, window=16, neighbours=3, prior_strength=4.0,
                                instance=(8.0, 2.5)).double()
    layer(x[:6])
    layer.domain_rows.fill_(rows)
    a = 4.0 / (4.0 + group.shape[0])
    got = layer.statistics(x[6:])
    for value, expected in zip(got, bounded_reference(group, bn, a)):
        torch.testing.assert_close(value, expected)
    plain = group_reference(group, bn, None, a)
    torch.testing.assert_close(got[0][~far], plain[0][0, ~far])  # near: mixed as without it
    assert (got[0][far] - plain[0][0, far]).abs().min() > 1.0  # far: the group's own, nearly


def test_one_domain_on_1x1_maps_mixes_as_without_the_instance_rule():
    """A 1x1 map has no instance variances (all 0): as the instance rule, the bounded pull
    skips it, and the group is mixed with the source at the size weight (a bound of 0 would
    keep the source out of the variance whatever its weight)."""
    bn = source_bn().double()
    x = mixed_batch(b=10).mean((2, 3), keepdim=True)
    bn.running_var.copy_(x.var((0, 2, 3)) * 20)  # the source far from the group
    rows = 7
    mu, a = x[-rows:, :, 0, 0], 4.0 / (4.0 + rows)  # the group's pixels: its instance means
    plain = (a * bn.running_mean + (1 - a) * mu.mean(0),
             a * bn.running_var + (1 - a) * mu.var(0, unbiased=False))
    for instance in (None, (8.0, 2.5)):
        layer = NeighbourhoodNorm2d(bn, window=16, neighbours=3, prior_strength=4.0,
                                    instance=instance).double()
        layer(x[:6])
        layer.domain_rows.fill_(rows)
        got = layer.statistics(x[6:])
        torch.testing.assert_close(got[0], plain[0])
        torch.testing.assert_close(got[1], plain[1])


@pytest.mark.parametrize("n", [2, 16, 32])
def test_offset_channels_is_a_chi_square_test_of_the_between_within_ratio(n):
    """A channel is flagged where the group's variance of instance means over its mean instance
    variance exceeds the source's ratio times chi2(1 - 0.05 / C, n - 1) / (n - 1), written out
    with SciPy; on either side of that bar by 1%."""
    from scipy.stats import chi2

    g = torch.Generator().manual_seed(n)
    mu, s2 = torch.randn(n, 8, generator=g, dtype=torch.float64), \
        torch.rand(n, 8, generator=g, dtype=torch.float64) + 0.5
    ratio = mu.var(0, unbiased=False) / s2.mean(0)
    bar = chi2.ppf(1 - 0.05 / 8, n - 1) / (n - 1)
    above = torch.arange(8) % 2 == 0
    source = ratio / bar * torch.where(above, 1 / 1.01, 1.01)
    assert torch.equal(offset_channels(mu, s2, source), above)


def test_one_domain_channels_spread_beyond_the_source_take_each_sample_s_own_mean():
    """With the source's between/within ratio set, a layer with the instance rule gives each
    sample, in the channels :func:`offset_channels` flags, NOTE's rule on its mean around the
    group's bounded mean (k standard errors of the bounded variance), and elsewhere the bounded
    statistics as without the ratio; the variance is the bounded one everywhere."""
    bn = source_bn().double()
    x = mixed_batch(b=10)
    rows = 7
    group = x[10 - rows :]
    mu, s2 = group.mean((2, 3)), group.var((2, 3))
    layer = NeighbourhoodNorm2d(bn, window=16, neighbours=3, prior_strength=4.0,
                                instance=(0.5, 2.5)).double()  # a narrow band: means differ
    layer(x[:6])
    layer.domain_rows.fill_(rows)
    plain = layer.statistics(x[6:])  # the bounded statistics, one row
    layer.window_mean, layer.window_var = layer.window_mean[:6], layer.window_var[:6]
    ratio = mu.var(0, unbiased=False) / s2.mean(0)
    layer.source_ratio = ratio * torch.where(torch.arange(6) < 3, 0.01, 100.0)  # 3 flagged
    got = layer.statistics(x[6:])
    assert got[0].shape == got[1].shape == (4, 6)
    torch.testing.assert_close(got[1], plain[1].expand(4, -1))
    torch.testing.assert_close(got[0][:, 3:], plain[0][3:].expand(4, -1))
    own, _ = iabn_reference(mu[-4:], s2[-4:], plain[0], plain[1], 5 * 4, 0.5, bn.eps)
    torch.testing.assert_close(got[0][:, :3], own[:, :3])
    assert not torch.allclose(got[0][:, :3], plain[0][:3].expand(4, -1))


@given(st.floats(-5, 5), st.floats(-5, 5), st.floats(0, 1), st.floats(0, 3))
def test_bounded_mix_moves_by_at_most_weight_times_bound(source, target, weight, bound):
    """It moves ``target`` towards ``source`` (never past it), by ``weight`` times their
    difference while that is within ``bound``, and never further than ``weight * bound``."""
    t = functools.partial(torch.tensor, dtype=torch.float64)
    got = float(bounded_mix(t(source), t(target), weight, t(bound)))
    moved = target - got
    assert abs(moved) <= weight * bound + 1e-12
    assert moved * (target - source) >= 0 and abs(moved) <= abs(target - source) + 1e-12
    if abs(target - source) <= bound:
        assert got == pytest.approx(weight * source + (1 - weight) * target, abs=1e-9)


each_windowed_layer = pytest.mark.parametrize(
    "make", [lambda bn, instance: NeighbourhoodNorm2d(bn, 16, 4, 4.0, instance),
             lambda bn, instance: PooledNorm2d(bn, 16, 0.3, instance)],
    ids=["neighbourhood", "pooled"])
"""Both windowed layers, made by ``make(bn, instance)`` with a window of 16."""


@each_windowed_layer
def test_the_one_domain_mark_stays_on_the_host_when_the_layer_moves(make):
    """Read on the host in every forward, it is not moved with the buffers: on a GPU, reading
    it waits for no queued kernel."""
    layer = make(source_bn(), None).to("meta")
    assert layer.running_mean.device.type == "meta"
    assert layer.domain_rows.device.type == "cpu"


@each_windowed_layer
def test_layers_apply_the_instance_rule_only_off_one_domain(make):
    """With a band of 0 standard errors the rule leaves every sample its own statistics: so it
    does off one domain, and on a batch its owner marks one domain each sample has its group's
    statistics, whatever the band (the pooled layer's as without the rule; the neighbourhood
    layer's with the source's pull bounded, the next test)."""
    bn = source_bn().double()
    x = mixed_batch(b=10)

    def statistics(instance, rows):
        layer = make(bn, instance).double()
        layer(x[:6])
        layer.domain_rows.fill_(rows)
        return layer.statistics(x[6:])

    reference = None if isinstance(make(bn, None), PooledNorm2d) else (8.0, 2.5)
    for got, expected in zip(statistics((0.0, 0.0), 7), statistics(reference, 7)):
        torch.testing.assert_close(got, expected)
        assert got.shape == (x.shape[1],)  # one group: the whole batch's row
    own_mean, own_var = x[6:].mean((2, 3)), x[6:].var((2, 3))
    for got, expected in zip(statistics((0.0, 0.0), 0), (own_mean, own_var)):
        torch.testing.assert_close(got, expected)


@each_windowed_layer
def test_a_batch_of_one_domain_is_normalised_as_its_folded_rows_bit_for_bit(make):
    """On a batch of one domain the layer normalises with its group's one row, through the fused
    kernel on the batch itself: bit for bit what that row, given to every sample, gives through
    the fused kernel on the batch folded into the channels (as on other batches)."""
    bn = source_bn()
    x = mixed_batch(b=10).float() * 3 + 1
    layer = make(bn, (8.0, 2.5))
    layer(x[:6])
    layer.domain_rows.fill_(7)
    twin = make(bn, (8.0, 2.5))
    twin(x[:6])
    twin.domain_rows.fill_(7)
    mean, var = twin.statistics(x[6:])
    assert mean.shape == (x.shape[1],)
    with torch.no_grad():
        folded = normalize(x[6:], mean.expand(4, -1).clone(), var.expand(4, -1).clone(),
                           layer.weight, layer.bias, layer.eps, fused=True)
        assert torch.equal(layer(x[6:]), folded)


@pytest.mark.parametrize("rows", [0, 7])
@pytest.mark.parametrize("k", [None, 8.0])
@pytest.mark.parametrize("candidates", [None, [[0, 2, 5], [1, 3, 6], [4, 5, 6], [0, 3, 6]]])
@pytest.mark.parametrize("ratio", [None, 0.01])
def test_each_operator_s_fake_gives_the_shapes_it_returns(rows, k, candidates, ratio):
    """``torch.library.opcheck``: each layer operator's registered fake (what a compiled graph
    plans with) gives its outputs' shapes and types, on and off one domain, with and without
    the instance rule, candidates and the source's between/within ratio (4 samples, 3
    remembered of a window of 8, 6 channels)."""
    g = torch.Generator().manual_seed(0)
    mu, s2 = torch.randn(4, 6, generator=g), torch.rand(4, 6, generator=g)
    window_mean, window_var = torch.randn(5, 6, generator=g), torch.rand(5, 6, generator=g)
    source = (torch.zeros(6), torch.ones(6))
    head = (mu, s2, window_mean, window_var, 3, 8, torch.tensor(rows))
    candidates = None if candidates is None else torch.tensor(candidates)
    torch.library.opcheck(traced_neighbourhood, (
        *head, *source, 2, candidates, 16.0, 16, k, 2.5, 1e-5,
        None if ratio is None else torch.full((6,), ratio)))
    torch.library.opcheck(traced_pooled, (
        *head, torch.ones(7), candidates, *source, torch.tensor(0.3), 16, k, 2.5, 1e-5))


def test_pooled_layer_is_the_batch_at_the_weight_its_owner_sets():
    bn = source_bn().double()
    x = mixed_batch(b=12)
    layer = PooledNorm2d(bn, window=0, source_weight=0.8).double()
    layer.source_weight.fill_(0.35)
    mean, var = group_reference(x, bn, None, 0.35)
    got = layer.statistics(x)
    torch.testing.assert_close(got[0], mean[0])
    torch.testing.assert_close(got[1], var[0])
    assert "source_weight" not in layer.state_dict()  # its owner's state, not the layer's


def test_pooled_layer_with_candidates_gives_each_sample_its_candidate_rows():
    """Each sample's group is its candidate rows of the pool (the remembered samples, then the
    batch), at the weight its owner sets; None: the pool again."""
    bn = source_bn().double()
    x = mixed_batch(b=12)
    layer = PooledNorm2d(bn, window=8, source_weight=0.3).double()
    layer(x[:6])  # 6 remembered, of which the last 4 top up a batch of 4
    g = torch.Generator().manual_seed(0)
    candidates = torch.stack([torch.randperm(8, generator=g)[:3] for _ in range(4)])
    layer.candidates = candidates
    pool = x[2:10]
    mu, s2 = pool.mean((2, 3)), pool.var((2, 3))
    mean = torch.stack([mu[c].mean(0) for c in candidates])
    var = torch.stack([s2[c].mean(0) + mu[c].var(0, unbiased=False) for c in candidates])
    got = layer.statistics(x[6:10])
    torch.testing.assert_close(got[0], 0.3 * bn.running_mean + 0.7 * mean)
    torch.testing.assert_close(got[1], 0.3 * bn.running_var + 0.7 * var)
    assert "candidates" not in layer.state_dict()  # its owner's, set before each batch
    layer.candidates = None  # a batch of 2 after the 6 most recent: one pool
    whole = group_reference(x[4:], bn, None, 0.3)
    torch.testing.assert_close(layer.statistics(x[10:])[0], whole[0][0])


@pytest.mark.parametrize("layer", ["neighbourhood", "pooled"])
@pytest.mark.parametrize("c", [0.5, 3.0])
def test_instance_rule_band_is_c_observed_deviations_per_channel_at_least_k(layer, c):
    bn = source_bn().double()
    x = mixed_batch(b=10)
    k, length, eps = 2.0, x.shape[2] * x.shape[3], bn.eps
    neighbours = 4 if layer == "neighbourhood" else None

    def make(instance):
        if layer == "neighbourhood":
            return NeighbourhoodNorm2d(bn, 0, 4, 16.0, instance).double()
        return PooledNorm2d(bn, 0, 0.6, instance).double()

    got = make((k, c)).statistics(x)
    ref_mean, ref_var = make(None).statistics(x)
    mu, s2 = x.mean((2, 3)), x.var((2, 3))
    spread = torch.stack([mu[g].var(0, unbiased=False) for g in groups_of(x, neighbours)])
    rho = spread.mean(0) / ((s2 + eps) / length).mean(0)
    mean, var = iabn_reference(mu, s2, ref_mean, ref_var, length, (c * rho.sqrt()).clamp_min(k),
                               eps)
    torch.testing.assert_close(got[0], mean)
    torch.testing.assert_close(got[1], var)


def test_instance_rule_limits_are_instance_and_group_statistics():
    bn = source_bn().double()
    x = mixed_batch(b=8)
    mu, s2 = x.mean((2, 3)), x.var((2, 3))
    mean, var = PooledNorm2d(bn, 0, 0.5).double().statistics(x)
    spread = torch.zeros_like(mu)
    own = widened_instance_rule(mu, s2, mean, var, spread, 20, 0.0, 0.0, bn.eps)
    torch.testing.assert_close(own[0], mu)  # a band of 0: each sample's own statistics
    torch.testing.assert_close(own[1], s2)
    wide = widened_instance_rule(mu, s2, mean, var, spread + 1.0, 20, 0.0, 1e9, bn.eps)
    torch.testing.assert_close(wide[0], mean.expand_as(mu))  # a wide band: the group's
    torch.testing.assert_close(wide[1], var.expand_as(mu))


def test_spread_ratio_is_one_for_independent_positions():
    """White noise: instance means of one domain vary by exactly their standard error."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 3, 8, 8, generator=g, dtype=torch.float64)
    mu, s2 = x.mean((2, 3)), x.var((2, 3))
    spread = (mu - mu.mean(0)).square()
    assert (spread_ratio(spread, s2, 64, 0.0) - 1.0).abs().max() < 0.06


@pytest.mark.parametrize("make", [lambda bn, w: NeighbourhoodNorm2d(bn, w, 4, 16.0),
                                  lambda bn, w: PooledNorm2d(bn, w, 0.5)])
def test_window_tops_the_batch_up_with_the_most_recent_samples(make):
    bn = source_bn().double()
    x = mixed_batch(b=14)
    layer, plain = make(bn, 8).double(), make(bn, 0).double()
    layer(x[:6])
    # a batch of 3 is topped up to 8 with the 5 most recent samples (x[1:6])
    torch.testing.assert_close(layer(x[6:9]), plain(x[1:9])[5:])
    torch.testing.assert_close(layer.window_mean, x[1:9].mean((2, 3)))
    # a batch of 8 or more uses no window: the windowless result, bit for bit
    assert torch.equal(layer(x[6:14]), plain(x[6:14]))
    torch.testing.assert_close(layer.window_mean, x[6:14].mean((2, 3)))
    layer.reset_window()
    assert torch.equal(layer(x[6:9]), plain(x[6:9]))


def test_pooled_layer_leaves_out_the_rows_its_filter_drops():
    class Every(object):
        """Keeps every other remembered sample."""

        def keep(self, n_window, batch_size):
            return torch.arange(n_window) % 2 == 0

    bn = source_bn().double()
    x = mixed_batch(b=12)
    layer = PooledNorm2d(bn, 8, 0.5).double()
    layer(x[:8])
    plain = PooledNorm2d(bn, 0, 0.5).double()
    kept = torch.cat([x[3:8][torch.arange(5) % 2 == 0], x[8:11]])  # 5 remembered, 3 new
    layer.pool_weight = layer.filter_weights(Every(), 3)
    assert layer.pool_weight.dtype == torch.float64
    torch.testing.assert_close(layer(x[8:11]), plain(kept)[-3:])
    # weights set for another batch size are refused, not read against the wrong rows
    with pytest.raises(ValueError, match="pool_weight has 8 rows; the pool of this batch has 9"):
        layer(x[:9])


def test_fused_normalisation_matches_the_broadcast_one():
    bn = source_bn()
    layer = NeighbourhoodNorm2d(bn, 8, 4, 16.0, (3.0, 2.0))
    x = mixed_batch(b=6).float()
    mean, var = layer.statistics(x)
    layer.reset_window()  # the same state for the forward
    expected = normalize(x, mean, var, layer.weight, layer.bias, layer.eps)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_label_balance_weight_from_the_inverse_simpson_index():
    even, one = torch.arange(10), torch.full((7,), 3)
    assert label_balance_weight(even, 10, 0.4, 2.0) == pytest.approx(0.4)
    assert label_balance_weight(one, 10, 0.4, 2.0) == pytest.approx(1.0)
    classes = torch.tensor([0, 0, 0, 1, 1, 2])  # p = 1/2, 1/3, 1/6 over K = 4
    simpson = 1 / (1 / 4 + 1 / 9 + 1 / 36)
    evenness = (simpson - 1) / 3
    for power in (0.0, 1.0, 2.0, 3.0):
        assert label_balance_weight(classes, 4, 0.3, power) == pytest.approx(
            1 - 0.7 * evenness**power)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.floats(0.0, 1.0),
       st.floats(0.0, 4.0))
def test_label_balance_weight_lies_between_balanced_and_one_and_rises_with_power(
        classes, balanced, power):
    classes = torch.tensor(classes)
    weight = label_balance_weight(classes, 5, balanced, power)
    assert balanced - 1e-12 <= weight <= 1.0 + 1e-12
    assert label_balance_weight(classes, 5, balanced, power + 1.0) >= weight - 1e-12
    perm = classes[torch.randperm(classes.shape[0])]  # the order of the predictions is moot
    assert label_balance_weight(perm, 5, balanced, power) == pytest.approx(weight)


@pytest.mark.parametrize("make, name", [
    (lambda bn: NeighbourhoodNorm2d(bn, -1, 4, 16.0), "window"),
    (lambda bn: NeighbourhoodNorm2d(bn, 8, 0, 16.0), "neighbours"),
    (lambda bn: NeighbourhoodNorm2d(bn, 8, 4, 0.0), "prior_strength"),
    (lambda bn: PooledNorm2d(bn, -2, 0.5), "window"),
])
def test_bad_options_are_named(make, name):
    with pytest.raises(ValueError, match=name):
        make(source_bn())
