"""The cluster-aware layer's options beyond the paper (issue 12), against reference formulas
written with loops, and their limiting cases."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dyntta.norm import AlphaBatchNorm2d, ClusterAwareBatchNorm2d, lisc
from dyntta.norm.finch import next_level
from dyntta.norm.mixing import label_balance_weight, shift_weight, size_weight
from dyntta.norm.stats import instance_stats, spread_ratio
from tests.norm.test_layers import mixed_batch, source_bn


def partition(labels: torch.Tensor) -> set[frozenset[int]]:
    return {frozenset(torch.nonzero(labels == v).flatten().tolist()) for v in labels.unique()}


def reference_next_level(mu: torch.Tensor, labels: torch.Tensor) -> set[frozenset[int]]:
    """FINCH level step with loops: cluster means, cosine first neighbour, union-find."""
    groups = sorted(partition(labels), key=min)
    if len(groups) == 1:
        return set(groups)
    centres = torch.stack([mu[sorted(g)].mean(0) for g in groups])
    unit = centres / centres.norm(dim=1, keepdim=True)
    sim = unit @ unit.T
    sim.fill_diagonal_(float("-inf"))
    parent = list(range(len(groups)))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i, j in enumerate(sim.argmax(1).tolist()):
        parent[find(i)] = find(j)
    merged: dict[int, set[int]] = {}
    for i, g in enumerate(groups):
        merged.setdefault(find(i), set()).update(g)
    return {frozenset(g) for g in merged.values()}


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 40))
def test_next_level_equals_loop_reference_and_coarsens(seed, n):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(n, 5, generator=g, dtype=torch.float64)
    labels = lisc(mu, canonical=False)
    merged = next_level(mu, labels)
    assert partition(merged) == reference_next_level(mu, labels)
    k_before, k_after = len(partition(labels)), len(partition(merged))
    assert k_after == 1 or k_after <= k_before // 2
    for group in partition(labels):  # every old cluster lies inside one new cluster
        assert len({int(merged[i]) for i in group}) == 1


def test_merge_levels_apply_next_level_repeatedly():
    bn = source_bn()
    x = mixed_batch(b=24).float()
    layer = ClusterAwareBatchNorm2d(bn, merge_levels=2)
    layer(x)
    mu = instance_stats(x)[0]
    expected = next_level(mu, next_level(mu, lisc(mu, canonical=False)))
    assert partition(layer.last_labels) == partition(expected)


def test_size_weight_is_schneiders_prior():
    sizes = torch.tensor([[1.0], [4.0], [64.0]])
    torch.testing.assert_close(size_weight(sizes, 16.0), 16.0 / (16.0 + sizes))


def test_one_cluster_fixed_weight_is_alpha_bn():
    bn = source_bn().double()
    x = mixed_batch(b=10)
    cabn = ClusterAwareBatchNorm2d(bn, alpha=0.3, unbiased=False, cluster=False).double()
    torch.testing.assert_close(cabn(x), AlphaBatchNorm2d(bn, 0.3).double()(x))


def test_one_cluster_size_weight_is_alpha_bn_at_n_over_n_plus_b():
    bn = source_bn().double()
    x = mixed_batch(b=12)
    cabn = ClusterAwareBatchNorm2d(
        bn, unbiased=False, cluster=False, source_weight="size", prior_strength=4.0
    ).double()
    torch.testing.assert_close(cabn(x), AlphaBatchNorm2d(bn, 4.0 / 16.0).double()(x))


def test_shift_weight_equals_loop_reference():
    g = torch.Generator().manual_seed(1)
    mu = torch.randn(9, 4, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 3])
    source = torch.randn(4, generator=g, dtype=torch.float64)
    groups = [torch.nonzero(labels == k).flatten() for k in range(4)]
    means = {k: mu[idx].mean(0) for k, idx in enumerate(groups)}
    within = sum(((mu[idx] - means[k]) ** 2).sum(0) for k, idx in enumerate(groups))
    pooled = within / (9 - 4)
    expected = []
    for i in range(9):
        k = int(labels[i])
        noise = pooled.sum() / len(groups[k])
        expected.append(min(1.0, float(noise / ((means[k] - source) ** 2).sum())))
    cluster_mean = torch.stack([means[int(k)] for k in labels])
    sizes = torch.tensor([[float(len(groups[int(k)]))] for k in labels], dtype=torch.float64)
    got = shift_weight(mu, cluster_mean, sizes, source, fallback=0.8)
    torch.testing.assert_close(got.flatten(), torch.tensor(expected, dtype=torch.float64))


def test_shift_weight_limits():
    mu = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sizes = torch.ones(6, 1, dtype=torch.float64)
    # all singletons: the noise is unknown, the fallback is used
    assert torch.equal(shift_weight(mu, mu, sizes, mu[0], 0.8), torch.full((6, 1), 0.8, dtype=torch.float64))
    # one cluster sitting on the source mean: all source
    centre = mu.mean(0).expand(6, 3)
    one = torch.full((6, 1), 6.0, dtype=torch.float64)
    assert torch.equal(shift_weight(mu, centre, one, mu.mean(0), 0.8), torch.ones(6, 1).double())
    # far from the source: the weight falls like 1 / shift^2
    far = shift_weight(mu, centre, one, mu.mean(0) + 100.0, 0.8)
    assert (far < 1e-3).all()


def test_instance_k_limits_are_instance_and_cluster_statistics():
    bn = source_bn().double()
    x = mixed_batch(b=8)
    plain = ClusterAwareBatchNorm2d(bn).double()
    assert torch.equal(ClusterAwareBatchNorm2d(bn, instance_k=1e9).double()(x), plain(x))
    instance = ClusterAwareBatchNorm2d(bn, alpha=0.5, instance_k=0.0).double()
    norm = ClusterAwareBatchNorm2d(bn, alpha=0.0, cluster=False).double()  # fixed stats of x[i]
    for i in range(8):  # k = 0 keeps each sample's own statistics (instance norm)
        torch.testing.assert_close(instance(x)[i : i + 1], norm(x[i : i + 1]))


def test_instance_k_equals_iabn_formula_around_the_cluster_statistics():
    bn = source_bn().double()
    x = mixed_batch(b=8)
    k, length = 1.5, x.shape[2] * x.shape[3]
    ref_mean, ref_var = ClusterAwareBatchNorm2d(bn).double().statistics(x)
    mu, s2 = x.mean((2, 3)), x.var((2, 3))
    sd = (ref_var + bn.eps).sqrt()
    d_mu, d_var = mu - ref_mean, s2 - ref_var
    t_mu, t_var = k * sd / length**0.5, k * sd**2 * (2 / (length - 1)) ** 0.5
    mean = ref_mean + torch.sign(d_mu) * (d_mu.abs() - t_mu).clamp_min(0)
    var = (ref_var + torch.sign(d_var) * (d_var.abs() - t_var).clamp_min(0)).clamp_min(0)
    got = ClusterAwareBatchNorm2d(bn, instance_k=k).double().statistics(x)
    torch.testing.assert_close(got[0], mean)
    torch.testing.assert_close(got[1], var)


def iabn_reference(mu, s2, ref_mean, ref_var, length, k, eps):
    """IABN's rule written out: soft-shrink by k standard errors of the reference."""
    sd = (ref_var + eps).sqrt()
    d_mu, d_var = mu - ref_mean, s2 - ref_var
    t_mu, t_var = k * sd / length**0.5, k * sd**2 * (2 / (length - 1)) ** 0.5
    mean = ref_mean + torch.sign(d_mu) * (d_mu.abs() - t_mu).clamp_min(0)
    return mean, (ref_var + torch.sign(d_var) * (d_var.abs() - t_var).clamp_min(0)).clamp_min(0)


@pytest.mark.parametrize("grouping", [{}, {"neighbours": 4}, {"cluster": False}])
@pytest.mark.parametrize("c", [0.5, 3.0])
@pytest.mark.parametrize("per", ["layer", "channel"])
def test_instance_spread_widens_the_band_to_c_observed_deviations(grouping, c, per):
    bn = source_bn().double()
    x = mixed_batch(b=10)
    k, length, eps = 2.0, x.shape[2] * x.shape[3], bn.eps
    mu, s2 = x.mean((2, 3)), x.var((2, 3))
    layer = ClusterAwareBatchNorm2d(bn, instance_k=k, instance_spread=c, spread_per=per,
                                    **grouping).double()
    got = layer.statistics(x)
    plain = ClusterAwareBatchNorm2d(bn, **grouping).double()
    ref_mean, ref_var = plain.statistics(x)
    # each sample's group, written out: its cluster, its 4 most similar samples, or the batch
    if grouping.get("neighbours"):
        unit = mu / mu.norm(dim=1, keepdim=True)
        groups = [(unit @ unit[i]).argsort(descending=True)[:4] for i in range(10)]
    else:
        labels = plain.last_labels
        groups = [torch.nonzero(labels == labels[i]).flatten() for i in range(10)]
    spread = torch.stack([mu[g].var(0, unbiased=False) for g in groups])  # (B, C)
    se2 = (s2 + eps) / length
    rho = torch.tensor([spread[:, ch].mean() / se2[:, ch].mean() for ch in range(6)])
    # one band per layer (the median channel's) or each channel's own
    if per == "channel":
        band = (c * rho.sqrt()).clamp_min(k)
    else:
        band = max(k, c * float(rho.median().sqrt()))
    mean, var = iabn_reference(mu, s2, ref_mean, ref_var, length, band, eps)
    torch.testing.assert_close(got[0], mean)
    torch.testing.assert_close(got[1], var)


@pytest.mark.parametrize("grouping", [{}, {"neighbours": 4}, {"cluster": False}])
def test_instance_rule_around_the_cluster_shrinks_to_its_own_statistics_then_mixes(grouping):
    bn = source_bn().double()
    x = mixed_batch(b=10)
    k, length, eps, alpha = 1.5, x.shape[2] * x.shape[3], bn.eps, 0.7
    mu, s2 = x.mean((2, 3)), x.var((2, 3))
    own = ClusterAwareBatchNorm2d(bn, alpha=0.0, **grouping).double()  # the groups' statistics
    group_mean, group_var = own.statistics(x)
    mean, var = iabn_reference(mu, s2, group_mean, group_var, length, k, eps)
    got = ClusterAwareBatchNorm2d(bn, alpha=alpha, instance_k=k, instance_around="cluster",
                                  **grouping).double().statistics(x)
    torch.testing.assert_close(got[0], alpha * bn.running_mean.double() + (1 - alpha) * mean)
    torch.testing.assert_close(got[1], alpha * bn.running_var.double() + (1 - alpha) * var)
    around_mixed = ClusterAwareBatchNorm2d(bn, alpha=alpha, instance_k=k, **grouping).double()
    assert not torch.allclose(around_mixed.statistics(x)[0], got[0])


def test_instance_spread_zero_is_the_plain_instance_rule_and_large_c_keeps_the_groups():
    bn = source_bn().double()
    x = mixed_batch(b=12)
    plain = ClusterAwareBatchNorm2d(bn, instance_k=1.5).double()
    assert torch.equal(ClusterAwareBatchNorm2d(bn, instance_k=1.5, instance_spread=0.0)
                       .double()(x), plain(x))
    groups = ClusterAwareBatchNorm2d(bn, cluster=False).double()
    wide = ClusterAwareBatchNorm2d(bn, cluster=False, instance_k=0.0, instance_spread=1e9)
    torch.testing.assert_close(wide.double()(x), groups(x))


def test_spread_ratio_is_one_for_independent_positions():
    """White noise: instance means of one domain vary by exactly their standard error."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 3, 8, 8, generator=g, dtype=torch.float64)
    mu, s2 = x.mean((2, 3)), x.var((2, 3))
    spread = (mu - mu.mean(0)).square()
    assert abs(float(spread_ratio(spread, s2, 64, 0.0)) - 1.0) < 0.06


@pytest.mark.parametrize("source_weight", ["fixed", "size", "shift"])
def test_window_equals_clustering_the_concatenated_samples(source_weight):
    bn = source_bn().double()
    x = mixed_batch(b=14)
    first, second = x[:9], x[9:]
    windowed = ClusterAwareBatchNorm2d(bn, window=32, source_weight=source_weight).double()
    windowed(first)
    plain = ClusterAwareBatchNorm2d(bn, source_weight=source_weight).double()
    torch.testing.assert_close(windowed(second), plain(x)[9:])
    windowed.reset_window()
    torch.testing.assert_close(windowed(second), plain(second))


def test_window_keeps_only_the_last_w_samples():
    bn = source_bn().double()
    x = mixed_batch(b=12)
    layer = ClusterAwareBatchNorm2d(bn, window=5).double()
    for i in range(0, 12, 4):
        layer(x[i : i + 4])
    torch.testing.assert_close(layer.window_mean, x[7:].mean((2, 3)))


def test_top_up_window_supplies_only_the_missing_samples():
    bn = source_bn().double()
    x = mixed_batch(b=14)
    layer = ClusterAwareBatchNorm2d(bn, window=8, top_up=True).double()
    layer(x[:6])
    plain = ClusterAwareBatchNorm2d(bn).double()
    # a batch of 3 is topped up to 8 with the 5 most recent samples (x[1:6])
    torch.testing.assert_close(layer(x[6:9]), plain(x[1:9])[5:])
    # a batch of 8 or more uses no window: the windowless result, bit for bit
    assert torch.equal(layer(x[6:14]), plain(x[6:14]))
    torch.testing.assert_close(layer.window_mean, x[6:14].mean((2, 3)))


@pytest.mark.parametrize("grouping", [{"cluster": False}, {}, {"neighbours": 4}])
def test_set_weight_is_alpha_bn_at_the_weight_the_caller_sets(grouping):
    bn = source_bn().double()
    x = mixed_batch(b=12)
    cabn = ClusterAwareBatchNorm2d(bn, alpha=0.8, unbiased=False, source_weight="set",
                                   **grouping).double()
    fixed = ClusterAwareBatchNorm2d(bn, alpha=0.35, unbiased=False, **grouping).double()
    assert float(cabn.set_weight) == pytest.approx(0.8)  # alpha until the caller sets it
    cabn.set_weight.fill_(0.35)
    torch.testing.assert_close(cabn(x), fixed(x))


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


@pytest.mark.parametrize(
    "option",
    [
        {"merge_levels": -1},
        {"source_weight": "adaptive"},
        {"prior_strength": 0.0},
        {"instance_k": -1.0},
        {"instance_spread": 2.0},
        {"instance_k": 8.0, "instance_spread": -1.0},
        {"spread_per": "sample"},
        {"instance_around": "source"},
        {"window": -2},
    ],
)
def test_bad_options_are_named(option):
    name = list(option)[-1]
    with pytest.raises(ValueError, match=name):
        ClusterAwareBatchNorm2d(source_bn(), **option)


@pytest.mark.parametrize("cluster", [True, False])
def test_fused_normalisation_changes_only_the_rounding(cluster):
    options = dict(cluster=cluster, neighbours=4 if cluster else 0, window=8, instance_k=3.0,
                   instance_spread=2.0)
    plain = ClusterAwareBatchNorm2d(source_bn(), **options)
    fused = ClusterAwareBatchNorm2d(source_bn(), fused=True, **options)
    with torch.no_grad():
        for seed in range(3):  # the windows fill: the same state in both
            x = mixed_batch(b=6, seed=seed).float()
            torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)
        assert fused.statistics(x)[0].shape == (6, 6)  # per sample: the instance rule
    one = ClusterAwareBatchNorm2d(source_bn(), cluster=False, window=8)
    mean, var = one.statistics(mixed_batch(b=6).float())
    assert mean.shape == var.shape == (6,)  # one group, shared: TBN's fused kernel applies it
