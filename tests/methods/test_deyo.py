"""DeYO: the patch shuffle, and one update against a reference built from the paper's
equations (entropy and PLPD selection, Eq. 10 weighting)."""

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dyntta
from dyntta.methods.deyo import DeYOConfig, shuffle_patches
from tests.conftest import random_images, tensor_state, tiny_resnet


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 1000), patch_len=st.sampled_from([1, 2, 4]), hw=st.sampled_from([4, 8]))
def test_patch_shuffle_keeps_the_pixel_multiset_and_moves_whole_patches(seed, patch_len, hw):
    x = torch.rand(3, 2, hw, hw, generator=torch.Generator().manual_seed(seed))
    out = shuffle_patches(x, patch_len, torch.Generator().manual_seed(seed))
    for i in range(3):
        for c in range(2):
            assert torch.equal(out[i, c].flatten().sort().values, x[i, c].flatten().sort().values)
    s = hw // patch_len
    cut = lambda t: [t[:, r * s:(r + 1) * s, q * s:(q + 1) * s] for r in range(patch_len)
                     for q in range(patch_len)]  # noqa: E731
    for i in range(3):
        originals = cut(x[i])
        moved = cut(out[i])
        for patch in moved:  # every output patch is one input patch, each used once
            matches = [j for j, o in enumerate(originals) if torch.equal(o, patch)]
            assert len(matches) == 1
            originals.pop(matches[0])


def test_patch_shuffle_is_seeded_and_one_patch_is_the_identity():
    x = random_images(4)
    a = shuffle_patches(x, 4, torch.Generator().manual_seed(5))
    assert torch.equal(a, shuffle_patches(x, 4, torch.Generator().manual_seed(5)))
    assert not torch.equal(a, x)
    assert torch.equal(shuffle_patches(x, 1, torch.Generator()), x)


def test_patch_shuffle_resizes_sizes_that_are_not_multiples():
    x = random_images(2, size=10)
    assert shuffle_patches(x, 4, torch.Generator()).shape == x.shape
    with pytest.raises(ValueError, match="smaller"):
        shuffle_patches(random_images(1, size=3), 4, torch.Generator())


def reference_step(model, x, margin, margin_e0, tau_plpd, seed, lr):
    """DeYO's update written from the paper's equations on a copy of the adapted model."""
    logits = model(x)
    num_classes = logits.shape[1]
    entropy = -(logits.softmax(1) * logits.log_softmax(1)).sum(1)
    kept = entropy < margin * math.log(num_classes)
    x_kept = x[kept]
    with torch.no_grad():
        shuffled = shuffle_patches(x_kept, 4, torch.Generator().manual_seed(seed))
        probs_shuffled = model(shuffled).softmax(1)
    probs = logits[kept].detach().softmax(1)
    y = probs.argmax(1)
    plpd = probs[torch.arange(len(y)), y] - probs_shuffled[torch.arange(len(y)), y]
    sel = plpd > tau_plpd
    e = entropy[kept][sel]
    weight = torch.exp(margin_e0 * math.log(num_classes) - e.detach()) + torch.exp(plpd[sel])
    loss = (e * weight).mean()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p -= lr * g  # SGD's first step: the momentum buffer is the gradient
    return int(kept.sum()), int(sel.sum())


def test_one_step_equals_the_reference_with_partial_selection():
    model = tiny_resnet()
    x = random_images(32, seed=3)
    # thresholds inside the observed ranges, so both filters keep some samples and drop others
    method = dyntta.adapt(model, "deyo", margin=0.93, plpd_threshold=0.0, lr=0.05)
    reference = copy.deepcopy(method.model)
    method(x)
    kept, selected = reference_step(reference, x, 0.93, 0.4, 0.0, 0, 0.05)
    assert 0 < selected < kept < 32, (kept, selected)
    assert (method.num_entropy_selected, method.num_selected) == (kept, selected)
    for got, want in zip(method.model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want)


def test_predictions_come_from_before_the_update():
    model = tiny_resnet()
    method = dyntta.adapt(model, "deyo", margin=0.99, plpd_threshold=-1.0, lr=0.5)
    before = copy.deepcopy(method.model)
    x = random_images(16)
    torch.testing.assert_close(method(x), before(x))
    assert method.num_selected > 0
    assert not torch.allclose(method.model(x), before(x))


def test_no_step_at_all_when_no_sample_passes():
    method = dyntta.adapt(tiny_resnet(), "deyo", margin=1e-6)
    before = {k: v.clone() for k, v in tensor_state(method).items()}
    method(random_images(16))
    assert all(torch.equal(v, before[k]) for k, v in tensor_state(method).items())
    assert method.optimizer.state_dict()["state"] == {}
    method2 = dyntta.adapt(tiny_resnet(), "deyo", margin=0.99, plpd_threshold=1.0)
    method2(random_images(16))
    assert method2.num_entropy_selected > 0 and method2.num_selected == 0
    assert method2.optimizer.state_dict()["state"] == {}


def test_frozen_stages_keep_their_bn_parameters():
    method = dyntta.adapt(tiny_resnet(), "deyo", frozen=("layer2",))
    assert method.adapted_names and not any("layer2" in n for n in method.adapted_names)
    assert any("layer1" in n for n in method.adapted_names)


@pytest.mark.parametrize(
    "kwargs", [{"margin": 0.0}, {"margin_e0": -1.0}, {"patch_len": 0}, {"frozen": "layer4"}]
)
def test_bad_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        DeYOConfig(**kwargs)


def test_config_defaults_are_the_papers():
    c = DeYOConfig()
    assert (c.margin, c.margin_e0, c.plpd_threshold, c.patch_len) == (0.5, 0.4, 0.2, 4)
    assert (c.lr, c.momentum, c.nesterov) == (1e-4, 0.9, False)
