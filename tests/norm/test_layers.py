"""CABN, TBN and alpha-BN against reference formulas and their defining invariants."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dyntta.norm import (
    AlphaBatchNorm2d,
    ClusterAwareBatchNorm2d,
    SourceBatchNorm2d,
    TestBatchNorm2d,
    lisc,
    replace_batchnorm,
)
from tests.conftest import tensor_state


def source_bn(c: int = 6, seed: int = 0) -> nn.BatchNorm2d:
    g = torch.Generator().manual_seed(seed)
    bn = nn.BatchNorm2d(c)
    bn.running_mean.copy_(torch.randn(c, generator=g))
    bn.running_var.copy_(torch.rand(c, generator=g) + 0.5)
    bn.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
    bn.bias.data.copy_(torch.randn(c, generator=g))
    return bn.eval()


def mixed_batch(b: int = 12, c: int = 6, seed: int = 0) -> torch.Tensor:
    """Half the batch shifted and scaled: two domains."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, c, 5, 4, generator=g, dtype=torch.float64)
    x[b // 2 :] = 3 * x[b // 2 :] + 2
    return x


def per_cluster_reference(x, bn, alpha, mix="var", unbiased=True):
    """Loop over clusters: each cluster normalised with its own statistics only."""
    mu = x.mean(dim=(2, 3))
    labels = lisc(mu)
    out = torch.empty_like(x)
    for k in labels.unique():
        members = x[labels == k]
        inst_mu = members.mean(dim=(2, 3))
        inst_var = members.var(dim=(2, 3), unbiased=unbiased)
        mu_k = inst_mu.mean(0)
        var_k = inst_var.mean(0) + ((inst_mu - mu_k) ** 2).mean(0)
        mean = alpha * bn.running_mean + (1 - alpha) * mu_k
        if mix == "var":
            var = alpha * bn.running_var + (1 - alpha) * var_k
        else:
            var = (alpha * bn.running_var.sqrt() + (1 - alpha) * var_k.sqrt()) ** 2
        c = x.shape[1]
        normed = (members - mean.view(1, c, 1, 1)) / torch.sqrt(var.view(1, c, 1, 1) + bn.eps)
        out[labels == k] = normed * bn.weight.view(1, c, 1, 1) + bn.bias.view(1, c, 1, 1)
    return out


@pytest.mark.parametrize("mix", ["var", "std"])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8])
def test_cabn_equals_independent_per_cluster_loop(mix, alpha):
    bn = source_bn().double()
    x = mixed_batch()
    layer = ClusterAwareBatchNorm2d(bn, alpha=alpha, mix=mix).double()
    torch.testing.assert_close(layer(x), per_cluster_reference(x, bn, alpha, mix))
    assert layer.last_labels.unique().numel() >= 2


def test_cabn_with_alpha_one_is_exactly_the_source_eval_bn():
    bn = source_bn()
    x = mixed_batch().float()
    torch.testing.assert_close(ClusterAwareBatchNorm2d(bn, alpha=1.0)(x), bn(x))


def test_cabn_alpha_zero_one_cluster_is_tbn():
    bn = source_bn()
    x = torch.randn(10, 6, 4, 4, dtype=torch.float64)
    one_cluster = lambda mu: torch.zeros(mu.shape[0], dtype=torch.long)  # noqa: E731
    cabn = ClusterAwareBatchNorm2d(bn, alpha=0.0, unbiased=False, clustering=one_cluster).double()
    tbn = nn.BatchNorm2d(6).double().train()
    tbn.load_state_dict(bn.state_dict())
    torch.testing.assert_close(cabn(x), tbn(x))
    torch.testing.assert_close(TestBatchNorm2d(bn).double()(x), tbn(x))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 16))
def test_cabn_is_stateless_and_permutation_equivariant(seed, b):
    bn = source_bn(seed=seed)
    layer = ClusterAwareBatchNorm2d(bn).double()
    before = {k: v.clone() for k, v in tensor_state(layer).items()}
    x = mixed_batch(b=b, seed=seed)
    perm = torch.randperm(b, generator=torch.Generator().manual_seed(seed))
    out = layer(x)
    torch.testing.assert_close(layer(x), out)
    torch.testing.assert_close(layer(x[perm]), out[perm])
    for k, v in tensor_state(layer).items():
        assert torch.equal(v, before[k].to(v.dtype)), k


def test_cabn_one_sample_uses_its_instance_statistics():
    bn = source_bn()
    x = torch.randn(1, 6, 3, 3, dtype=torch.float64)
    out = ClusterAwareBatchNorm2d(bn, alpha=0.0).double()(x)
    ref = (x - x.mean((2, 3), keepdim=True)) / torch.sqrt(
        x.var((2, 3), keepdim=True) + bn.eps
    ) * bn.weight.double().view(1, -1, 1, 1) + bn.bias.double().view(1, -1, 1, 1)
    torch.testing.assert_close(out, ref)


def test_cabn_1x1_feature_maps_give_finite_output():
    out = ClusterAwareBatchNorm2d(source_bn())(torch.randn(8, 6, 1, 1))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("alpha", [0.0, 0.4, 1.0])
def test_alpha_bn_mixes_source_and_batch_statistics(alpha):
    bn = source_bn().double()
    x = mixed_batch()
    var, mean = torch.var_mean(x, dim=(0, 2, 3), correction=0)
    m = alpha * bn.running_mean + (1 - alpha) * mean
    v = alpha * bn.running_var + (1 - alpha) * var
    ref = nn.functional.batch_norm(x, m, v, bn.weight, bn.bias, False, 0.0, bn.eps)
    torch.testing.assert_close(AlphaBatchNorm2d(bn, alpha).double()(x), ref)


def test_source_layer_equals_eval_bn():
    bn = source_bn()
    x = torch.randn(4, 6, 3, 3)
    torch.testing.assert_close(SourceBatchNorm2d(bn)(x), bn(x))


def test_layers_reject_wrong_channel_count():
    with pytest.raises(ValueError, match=r"expects \(B, 6, H, W\)"):
        ClusterAwareBatchNorm2d(source_bn())(torch.randn(2, 5, 3, 3))


def test_layer_needs_running_statistics():
    with pytest.raises(ValueError, match="track_running_stats=False"):
        ClusterAwareBatchNorm2d(nn.BatchNorm2d(3, track_running_stats=False))


def test_cabn_rejects_unknown_mix():
    with pytest.raises(ValueError, match="mix"):
        ClusterAwareBatchNorm2d(source_bn(), mix="mean")


def test_replace_batchnorm_errors_without_bn2d_and_warns_on_bn1d():
    with pytest.raises(ValueError, match="no nn.BatchNorm2d"):
        replace_batchnorm(nn.Sequential(nn.Conv2d(3, 3, 1)), TestBatchNorm2d)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Flatten(), nn.BatchNorm1d(4))
    with pytest.warns(UserWarning, match=r"left untouched.*'3'"):
        assert replace_batchnorm(model, TestBatchNorm2d) == 1
    assert isinstance(model[1], TestBatchNorm2d) and isinstance(model[3], nn.BatchNorm1d)


@pytest.mark.parametrize("per_sample, fold", [(False, False), (True, False), (True, True)])
def test_normalize_fused_and_differentiable_paths_agree(per_sample, fold):
    from dyntta.norm import normalize

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 4, 4, generator=g)
    shape = (5, 3) if per_sample else (3,)
    mean, var = torch.randn(shape, generator=g), torch.rand(shape, generator=g) + 0.1
    weight, bias = torch.randn(3, generator=g), torch.randn(3, generator=g)
    with torch.no_grad():
        fused = normalize(x, mean, var, weight, bias, 1e-5, fused=fold)
        plain = normalize(x, mean, var, None, None, 1e-5, fused=fold)
    weight.requires_grad_(True)
    traced = normalize(x, mean, var, weight, bias, 1e-5)
    assert traced.requires_grad
    torch.testing.assert_close(traced, fused)
    view = (1, 3, 1, 1) if not per_sample else (5, 3, 1, 1)
    ref = (x - mean.view(view)) / torch.sqrt(var.view(view) + 1e-5) * weight.view(1, 3, 1, 1)
    torch.testing.assert_close(fused, ref + bias.view(1, 3, 1, 1))
    torch.testing.assert_close(plain * weight.view(1, 3, 1, 1), ref)


def test_instance_and_batch_stats_match_torch_var_mean():
    from dyntta.norm import batch_stats, instance_stats

    x = torch.randn(6, 4, 5, 3, dtype=torch.float64) * 2 + 3
    var, mean = torch.var_mean(x, dim=(2, 3), correction=1)
    torch.testing.assert_close(instance_stats(x), (mean, var))
    var, mean = torch.var_mean(x, dim=(0, 2, 3), correction=0)
    torch.testing.assert_close(batch_stats(x), (mean, var))


@pytest.mark.parametrize("ratio", [0.0, 1.0, 10.0, 30.0])
def test_one_pass_float32_instance_variance_stays_accurate(ratio):
    """E[x^2] - mean^2 in float32: error relative to var ~ 1e-7 * (1 + (mean/std)^2)."""
    from dyntta.norm import instance_stats

    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, 32, 32, generator=g, dtype=torch.float64)
    x = x * torch.rand(8, 16, 1, 1, generator=g, dtype=torch.float64).add(0.5)
    x = x + ratio * torch.randn(8, 16, 1, 1, generator=g, dtype=torch.float64).sign()
    exact_var, exact_mean = torch.var_mean(x, dim=(2, 3), correction=1)
    mean, var = instance_stats(x.float())
    assert ((var.double() - exact_var).abs() / exact_var).max() < 2e-6 * (1 + 4 * ratio**2)
    torch.testing.assert_close(mean.double(), exact_mean, rtol=0, atol=1e-6 * (1 + ratio))


def test_constant_channels_get_no_negative_and_only_rounding_sized_variance():
    """The one-pass variance's absolute error is ~ float32 eps * mean^2; it never goes below 0."""
    from dyntta.norm import instance_stats

    x = torch.full((4, 3, 7, 7), 0.1) + torch.arange(4.0).view(4, 1, 1, 1) * 1e3
    mean, var = instance_stats(x)
    assert (var >= 0).all()
    assert (var <= 4 * torch.finfo(torch.float32).eps * mean.square()).all()
    torch.testing.assert_close(mean, x[:, :, 0, 0])


def test_cluster_statistics_depend_only_on_which_labels_are_equal():
    from dyntta.norm import cluster_stats

    g = torch.Generator().manual_seed(0)
    mean, var = torch.randn(9, 4, generator=g), torch.rand(9, 4, generator=g)
    labels = torch.tensor([0, 1, 0, 2, 1, 1, 0, 2, 3])
    expected = cluster_stats(mean, var, labels)
    relabelled = torch.tensor([35, 21, 35, 7, 21, 21, 35, 7, 56])  # same partition
    torch.testing.assert_close(cluster_stats(mean, var, relabelled), expected)
    for k in labels.unique():
        members = labels == k
        mu_k = mean[members].mean(0)
        var_k = var[members].mean(0) + (mean[members] - mu_k).square().mean(0)
        torch.testing.assert_close(expected[0][members], mu_k.expand(int(members.sum()), 4))
        torch.testing.assert_close(expected[1][members], var_k.expand(int(members.sum()), 4))
