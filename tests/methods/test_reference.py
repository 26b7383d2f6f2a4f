"""The source's between/within ratios that dyn_adaptive reads on clean images."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import dyntta
from dyntta.methods import reference
from dyntta.methods.reference import reference_ratios, source_ratios
from dyntta.norm.adaptive import NeighbourhoodNorm2d
from tests.conftest import random_images, tiny_resnet


def test_source_ratios_are_the_first_stage_s_between_within_ratios_on_clean_images():
    """Per BN layer at the largest map size (the first stage) and no other: the variance of
    the instance means between the images of each group of 32, summed over the groups, over the
    summed mean instance variance (unbiased, over H x W - 1), written out from the layers'
    recorded inputs; the model unchanged, the 8 images of no full group left out."""
    model = tiny_resnet()
    images = random_images(72, size=8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs: dict[str, list[torch.Tensor]] = {}
    bns = {name: m for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    hooks = [m.register_forward_pre_hook(
        lambda m, args, name=name: inputs.setdefault(name, []).append(args[0]))
        for name, m in bns.items()]
    with torch.no_grad():
        for start in (0, 32):
            model(images[start : start + 32])
    for hook in hooks:
        hook.remove()
    largest = max(xs[0].shape[2] * xs[0].shape[3] for xs in inputs.values())
    got = source_ratios(model, images)
    first = sorted(n for n, xs in inputs.items() if xs[0].shape[2] * xs[0].shape[3] == largest)
    assert sorted(got) == first and len(first) < len(bns)
    for name in first:
        between = sum(x.mean((2, 3)).var(0, unbiased=False) for x in inputs[name])
        within = sum(x.var((2, 3)).mean(0) for x in inputs[name])
        torch.testing.assert_close(got[name], between / within)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_a_reading_is_remembered_by_content_and_read_anew_when_it_changes(monkeypatch):
    """Equal contents (other tensors, another copy of the model) give the stored reading
    without a forward; a changed pixel or weight reads anew; each reading equals
    :func:`source_ratios`' and is the caller's own copy."""
    model, images = tiny_resnet(), random_images(64, size=8)
    monkeypatch.setattr(reference, "_READINGS", {})
    reads = []
    monkeypatch.setattr(reference, "source_ratios",
                        lambda *a: reads.append(1) or source_ratios(*a))
    first = reference_ratios(model, images)
    again = reference_ratios(copy.deepcopy(model), images.clone())
    assert len(reads) == 1 and first.keys() == again.keys()
    for name, ratio in source_ratios(model, images).items():
        assert torch.equal(first[name], ratio) and torch.equal(again[name], ratio)
    first[name].zero_()
    assert torch.equal(reference_ratios(model, images)[name], ratio)
    changed = images.clone()
    changed[0, 0, 0, 0] = 1.0 - changed[0, 0, 0, 0]
    reference_ratios(model, changed)
    with torch.no_grad():
        next(model.parameters()).add_(0.5)
    reference_ratios(model, images)
    assert len(reads) == 3


def test_dyn_adaptive_hands_the_ratios_to_its_first_stage_and_keeps_them():
    """The first stage's neighbourhood layers hold the ratios read on the reference, the
    others none; reset() and a saved state loaded into a method built without the reference
    keep them, and the next logits agree."""
    model, clean = tiny_resnet(), random_images(64, size=8)
    adapted = dyntta.adapt(model, "dyn_adaptive", reference=clean)
    expected = source_ratios(model, clean)
    adapted(random_images(16, size=8, seed=1))

    def held(method):
        return {name: m.source_ratio for name, m in method.model.named_modules()
                if isinstance(m, NeighbourhoodNorm2d)}

    layers = held(adapted)
    assert {n for n, r in layers.items() if r is not None} == set(expected)
    for name, ratio in expected.items():
        assert torch.equal(layers[name], ratio)
    state = adapted.state_dict()
    fresh = dyntta.adapt(model, "dyn_adaptive")
    fresh.load_state_dict(state)
    for name, ratio in expected.items():
        assert torch.equal(held(fresh)[name], ratio)
    batch = random_images(16, size=8, seed=2)
    torch.testing.assert_close(fresh(batch), adapted(batch), rtol=0, atol=0)
    adapted.reset()
    for name, ratio in expected.items():
        assert torch.equal(held(adapted)[name], ratio)


def test_without_the_reference_no_layer_tests_its_groups_against_the_source():
    adapted = dyntta.adapt(tiny_resnet(), "dyn_adaptive")
    adapted(random_images(16, size=8))
    assert adapted.source_ratios == {}
    assert all(m.source_ratio is None for m in adapted.modules()
               if isinstance(m, NeighbourhoodNorm2d))


@pytest.mark.parametrize("images, message", [
    (torch.rand(31, 3, 8, 8), r"n >= 32"),
    (torch.rand(32, 8, 8), r"\(n, C, H, W\)"),
    ((torch.rand(32, 3, 8, 8) * 255).to(torch.uint8), r"float"),
    (torch.rand(32, 3, 8, 8) * 255, r"^reference images: input values must lie in \[0, 1\]"),
])
def test_bad_reference_images_are_one_clear_error(images, message):
    with pytest.raises(ValueError, match=message):
        dyntta.adapt(tiny_resnet(), "dyn_adaptive", reference=images)


def test_a_method_that_reads_no_reference_refuses_one():
    with pytest.raises(ValueError, match=r"'tbn' reads no reference images .*dyn_adaptive"):
        dyntta.adapt(tiny_resnet(), "tbn", reference=random_images(32, size=8))
