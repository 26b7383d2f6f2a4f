"""ViDA: adapters start as the identity, HKA scales, the teacher's two-rate EMA, the restore."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import dyntta
from dyntta.methods.augmentation import StrongAugmentation
from dyntta.methods.vida import ViDAConfig
from dyntta.methods.vida_adapter import ViDAAdapter, inject_adapters
from tests.conftest import random_images, tiny_resnet


SMALL = {"rank_high": 8, "num_augmentations": 2}  # fast settings where the defaults don't matter


CONV_GEOMETRY = {
    "kernel": st.sampled_from([1, 3]),
    "stride": st.sampled_from([1, 2]),
    "padding": st.sampled_from([0, 1]),
    "dilation": st.sampled_from([1, 2]),
    "seed": st.integers(0, 100),
}


@settings(max_examples=12, deadline=None)
@given(**CONV_GEOMETRY, ranks=st.sampled_from([(1, 16), (2, 5)]))
def test_a_fresh_adapter_is_the_identity_beside_any_convolution(
    kernel, stride, padding, dilation, ranks, seed
):
    torch.manual_seed(seed)
    conv = nn.Conv2d(3, 5, kernel, stride, padding, dilation, bias=seed % 2 == 0)
    x = torch.randn(2, 3, 9, 9)
    adapter = ViDAAdapter(conv, *ranks, torch.Generator().manual_seed(seed))
    torch.testing.assert_close(adapter(x), conv(x))
    with torch.no_grad():  # the branches are wired: non-zero up-projections change the output
        adapter.vida_up.weight.fill_(1.0)
    assert adapter(x).shape == conv(x).shape
    assert not torch.allclose(adapter(x), conv(x))


def branchwise_reference(adapter: ViDAAdapter, x: torch.Tensor) -> torch.Tensor:
    """``layer(x) + s1 * up(down(x)) + s2 * up2(down2(x))``, each branch run on its own."""
    return (
        adapter.layer(x)
        + adapter.scale_low * adapter.vida_up(adapter.vida_down(x))
        + adapter.scale_high * adapter.vida_up2(adapter.vida_down2(x))
    )


@settings(max_examples=12, deadline=None)
@given(**CONV_GEOMETRY, groups=st.sampled_from([1, 3]))
def test_merged_layer_equals_the_branches_in_output_and_gradients(
    kernel, stride, padding, dilation, groups, seed
):
    torch.manual_seed(seed)
    conv = nn.Conv2d(6, 9, kernel, stride, padding, dilation, groups=groups, bias=seed % 2 == 0)
    layers = [conv, nn.Linear(7, 4)]
    inputs = [torch.randn(2, 6, 9, 9), torch.randn(3, 5, 7)]
    for layer, x in zip(layers, inputs):
        adapter = ViDAAdapter(layer, 2, 5, torch.Generator().manual_seed(seed))
        assert adapter.mergeable == (groups == 1 or isinstance(layer, nn.Linear))
        with torch.no_grad():
            adapter.vida_up.weight.normal_()
            adapter.vida_up2.weight.normal_()
            adapter.scale_low.fill_(0.7)
            adapter.scale_high.fill_(1.3)
        results = []
        for run in (adapter, lambda t: branchwise_reference(adapter, t)):
            adapter.zero_grad()
            xi = x.clone().requires_grad_(True)
            out = run(xi)
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
            grads = [p.grad.clone() for p in adapter.parameters()]
            results.append((out.detach(), xi.grad, grads))
        (out, gx, grads), (ref, ref_gx, ref_grads) = results
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(gx, ref_gx, rtol=1e-4, atol=1e-5)
        for g, ref_g in zip(grads, ref_grads):
            # a weight's gradient sums over batch and positions: float32 rounding grows with it
            scale = max(1.0, float(ref_g.abs().max()))
            torch.testing.assert_close(g, ref_g, rtol=1e-4, atol=1e-5 * scale)


def test_a_fresh_adapter_is_the_identity_beside_a_linear_layer_and_initialised_as_the_code():
    linear = nn.Linear(6, 4)
    adapter = ViDAAdapter(linear, 1, 128, torch.Generator().manual_seed(0))
    x = torch.randn(5, 6)
    torch.testing.assert_close(adapter(x), linear(x))
    assert torch.all(adapter.vida_up.weight == 0) and torch.all(adapter.vida_up2.weight == 0)
    assert adapter.vida_down2.weight.std().item() == pytest.approx(1 / 128**2, rel=0.1)
    assert adapter.layer is linear  # shared, not copied


def test_the_adapted_model_starts_as_the_source_model_with_batch_statistics(tiny_model):
    x = random_images(8)
    method = dyntta.adapt(tiny_model, "vida")
    n_wrapped = sum(isinstance(m, ViDAAdapter) for m in method.model.modules())
    assert n_wrapped == sum(isinstance(m, (nn.Conv2d, nn.Linear)) for m in tiny_model.modules())
    torch.testing.assert_close(method.model(x), dyntta.adapt(tiny_model, "tbn")(x))
    with pytest.raises(ValueError, match="no nn.Conv2d"):
        inject_adapters(nn.Sequential(nn.ReLU()), 1, 2)


@pytest.mark.parametrize("hka", ["code", "paper"])
@pytest.mark.parametrize("u", [0.01, 0.2])
def test_hka_scales(hka, u):
    method = dyntta.adapt(tiny_resnet(), "vida", hka=hka, threshold=0.05, rank_high=8)
    method.set_scales(torch.tensor(u))
    low, high = (1 - u, 1 + u) if u >= 0.05 else (1 + u, 1 - u)
    if hka == "code":
        high = 1.0  # the code's elif never reaches the high-rank scale
    for model in (method.model, method.teacher):
        for m in model.modules():
            if isinstance(m, ViDAAdapter):
                assert m.scale_low.item() == pytest.approx(low)
                assert m.scale_high.item() == pytest.approx(high)


def test_uncertainty_is_the_variance_of_the_teachers_augmented_predictions():
    method = dyntta.adapt(tiny_resnet(), "vida", num_augmentations=4, seed=3, rank_high=8)
    x = random_images(6)
    teacher = copy.deepcopy(method.teacher)
    augment = StrongAugmentation(3)
    with torch.no_grad():
        outputs = torch.stack([teacher(augment(x)) for _ in range(4)])
        expected = 0.1 * outputs.var(dim=0, unbiased=True).mean()
        torch.testing.assert_close(method.uncertainty(x), expected)


def test_one_step_returns_the_teacher_and_moves_the_teacher_by_two_rate_ema():
    keep, adapter_keep = 0.6, 0.9
    method = dyntta.adapt(
        tiny_resnet(), "vida", teacher_keep=keep, adapter_keep=adapter_keep, restore_prob=0.0,
        lr=1e-2, adapter_lr=1e-2, hka="paper", **SMALL,
    )
    method(random_images(8, seed=1))  # the teacher's adapters are non-zero from now on
    x = random_images(8)
    teacher_before = copy.deepcopy(method.teacher)
    student_before = {n: p.detach().clone() for n, p in method.model.named_parameters()}
    out = method(x)
    u = method.last_uncertainty.item()
    low, high = (1 - u, 1 + u) if u >= 0.05 else (1 + u, 1 - u)
    for m in teacher_before.modules():  # the teacher predicts with this batch's scales
        if isinstance(m, ViDAAdapter):
            m.scale_low.fill_(low)
            m.scale_high.fill_(high)
    torch.testing.assert_close(out, teacher_before(x))
    for m in teacher_before.modules():
        if isinstance(m, ViDAAdapter):
            m.scale_low.fill_(1.0)
            m.scale_high.fill_(1.0)
    assert not torch.allclose(out, teacher_before(x))  # the scales mattered
    moved = 0
    for (name, t), t0, s in zip(
        method.teacher.named_parameters(), teacher_before.parameters(), method.model.parameters()
    ):
        k = adapter_keep if "vida_" in name else keep
        torch.testing.assert_close(t, k * t0 + (1 - k) * s)
        moved += not torch.equal(s, student_before[name])
    assert moved > 0


def test_restore_probability_one_returns_the_student_to_its_initial_weights():
    method = dyntta.adapt(tiny_resnet(), "vida", restore_prob=1.0, lr=1e-2, **SMALL)
    initial = {n: p.detach().clone() for n, p in method.model.named_parameters()}
    method(random_images(8))
    for n, p in method.model.named_parameters():
        assert torch.equal(p, initial[n]), n
    assert not all(
        torch.equal(t, s) for t, s in zip(method.teacher.parameters(), method.model.parameters())
    )


def test_all_student_parameters_are_adapted_in_two_adam_groups(tiny_model):
    method = dyntta.adapt(tiny_model, "vida")
    names = [n for n, _ in method.model.named_parameters()]
    assert method.adapted_names == names
    source, adapters = method.optimizer.param_groups
    assert (source["lr"], adapters["lr"]) == (1e-4, 1e-5)
    assert len(adapters["params"]) == 4 * sum(
        isinstance(m, ViDAAdapter) for m in method.model.modules()
    )
    assert len(source["params"]) + len(adapters["params"]) == len(names)


@pytest.mark.parametrize(
    "kwargs",
    [{"lr": 0.0}, {"rank_low": 0}, {"teacher_keep": 1.1}, {"num_augmentations": 1},
     {"hka": "both"}, {"restore_prob": -0.1}],
)
def test_bad_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        ViDAConfig(**kwargs)
