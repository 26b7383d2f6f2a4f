"""The source weights read from the model on clean images under synthetic shifts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import norm

from dyntta.bench import sources
from dyntta.data.datasets import to_tensor
from dyntta.data.digits import load_digits_split
from dyntta.methods import source_weights
from dyntta.methods.source_weights import (
    CANDIDATES, SHIFTS, calibrate_source_weights, choose, synthetic_shift)
from dyntta.models import load_checkpoint
from tests.conftest import random_images, tensor_state, tiny_resnet


def box_mean(image: np.ndarray, size: int) -> np.ndarray:
    """Each pixel of (C, H, W) ``image`` replaced by the mean of the ``size`` x ``size`` window
    around it, the edges repeated outward: a loop, the direct reading."""
    r = size // 2
    padded = np.pad(image, ((0, 0), (r, r), (r, r)), mode="edge")
    out = np.empty_like(image)
    for i in range(image.shape[1]):
        for j in range(image.shape[2]):
            out[:, i, j] = padded[:, i : i + size, j : j + size].mean(axis=(1, 2))
    return out


def test_each_shift_is_its_formula():
    x = random_images(3, seed=1, size=8)
    shifted = {k: synthetic_shift(x, k, torch.Generator().manual_seed(5)) for k in SHIFTS}
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(shifted["noise"], (x + 0.2 * noise).clamp(0, 1))
    blurred = np.stack([box_mean(image, 5) for image in x.numpy()])
    np.testing.assert_allclose(shifted["blur"].numpy(), blurred, atol=1e-6)
    centre = x.mean(dim=(1, 2, 3), keepdim=True)
    torch.testing.assert_close(shifted["contrast"], centre + 0.3 * (x - centre))
    torch.testing.assert_close(shifted["brightness"], (x + 0.4).clamp(max=1.0))
    # 8 x 8 pixelated to 2 x 2: each 4 x 4 block holds its own mean
    blocks = x.reshape(3, 3, 2, 4, 2, 4).mean(dim=(3, 5))
    torch.testing.assert_close(shifted["pixelate"],
                               blocks.repeat_interleave(4, 2).repeat_interleave(4, 3))
    for image in shifted.values():
        assert image.min() >= 0 and image.max() <= 1


def test_an_unknown_shift_is_refused():
    with pytest.raises(ValueError, match="unknown shift 'fog'"):
        synthetic_shift(random_images(1), "fog", torch.Generator())


def test_choose_reads_the_paired_normal_interval():
    generator = torch.Generator().manual_seed(0)
    default = (torch.rand(400, generator=generator) < 0.5).double()
    better = torch.where(torch.rand(400, generator=generator) < 0.3, 1.0, default)
    slightly = default.clone()
    slightly[torch.nonzero(default == 0)[:3, 0]] = 1.0  # 3 images of 400: within noise
    result = choose({16.0: default, 4.0: better, 64.0: slightly}, 16.0)
    for n, hits in ((4.0, better), (64.0, slightly)):
        d = (hits - default).numpy()
        half = norm.ppf(0.975) * d.std(ddof=1) / np.sqrt(len(d))
        np.testing.assert_allclose(result.interval[n], (d.mean() - half, d.mean() + half))
        assert result.agreement[n] == pytest.approx(hits.mean().item())
    assert result.chosen == 4.0 and result.images == 400
    # the best beyond the default only within its interval: the default stays
    assert choose({16.0: default, 64.0: slightly}, 16.0).chosen == 16.0
    # equal agreement everywhere: the default
    assert choose({16.0: default, 1.0: default.clone()}, 16.0).chosen == 16.0


def digits_model_and_images():
    """The shipped digits model and every other image of its test split (225), with labels."""
    model = load_checkpoint(Path(sources.__file__).parent / sources.DIGITS_MODEL)
    _, _, x, y = load_digits_split()
    return model, to_tensor(x[::2]), torch.from_numpy(y[::2])


def test_stale_source_statistics_call_for_less_source():
    """On its own statistics the digits model predicts about as well at the defaults as at any
    value; with every BN layer's running mean moved by a quarter of its standard deviation
    (statistics that no longer describe its images) the default N falls far behind and the
    reading asks for less source, beyond its interval."""
    model, images, labels = digits_model_and_images()
    healthy = calibrate_source_weights(model, images).readings
    for name, default in (("prior_strength", 16.0), ("balanced_alpha", 0.4)):
        agreement = healthy[name].agreement
        assert max(agreement.values()) - agreement[default] < 0.05
    move_running_means(model, 0.25)
    stale = calibrate_source_weights(model, images, labels).readings["prior_strength"]
    assert stale.chosen < 16.0
    assert stale.agreement[stale.chosen] > stale.agreement[16.0] + 0.3
    assert stale.interval[stale.chosen][0] > 0


def test_stale_statistics_in_the_last_stage_call_for_less_deep_source():
    """The running means of the last stage's BN layers (which pool) moved by half their
    standard deviation: the deep source weight's reading, at the default N, asks for less
    than 0.4 beyond its interval."""
    model, images, labels = digits_model_and_images()
    move_running_means(model.net.layer3, 0.5)
    stale = calibrate_source_weights(model, images, labels, candidates={
        "balanced_alpha": CANDIDATES["balanced_alpha"]}).readings["balanced_alpha"]
    assert stale.chosen < 0.4
    assert stale.agreement[stale.chosen] > stale.agreement[0.4] + 0.05
    assert stale.interval[stale.chosen][0] > 0


def move_running_means(module: torch.nn.Module, sds: float) -> None:
    """Every BN layer's running mean in ``module`` moved by ``sds`` of its standard deviation."""
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean += sds * m.running_var.sqrt()


def test_each_option_is_read_at_the_values_chosen_before(monkeypatch):
    """The second option runs at the first's chosen value, the others at their defaults, and
    no stream runs twice: the run at the first's choice is the second's default."""
    calls = []
    real = source_weights.adapt

    def spy(model, method, **options):
        if method == "dyn_adaptive":
            calls.append(options)
        return real(model, method, **options)

    def smallest(hits, default):  # a choice away from the default, to see it carried on
        return dataclasses.replace(choose(hits, default), chosen=min(hits))

    monkeypatch.setattr(source_weights, "adapt", spy)
    monkeypatch.setattr(source_weights, "choose", smallest)
    result = calibrate_source_weights(tiny_resnet(), random_images(10, seed=2), batch_size=5,
                                      candidates={"prior_strength": (4.0, 64.0),
                                                  "balanced_alpha": (0.0,)})
    assert result.options == {"prior_strength": 4.0, "balanced_alpha": 0.0}
    assert calls == [{"prior_strength": 4.0}, {"prior_strength": 16.0},
                     {"prior_strength": 64.0},
                     {"prior_strength": 4.0, "balanced_alpha": 0.0}]
    first = result.readings["prior_strength"]
    assert result.readings["balanced_alpha"].agreement[0.4] == first.agreement[4.0]


def test_the_model_is_unchanged_and_the_reading_repeats():
    model = tiny_resnet()
    before = tensor_state(model)
    images = random_images(40, seed=3)
    first = calibrate_source_weights(model, images, batch_size=8, seed=1)
    assert first == calibrate_source_weights(model, images, batch_size=8, seed=1)
    assert list(first.readings) == list(CANDIDATES)
    for name, values in CANDIDATES.items():
        assert set(first.readings[name].agreement) == set(values)
        assert first.readings[name].images == 40
    for name, tensor in tensor_state(model).items():
        torch.testing.assert_close(tensor, before[name])
    # the default is always read, even when not among the candidates
    only = calibrate_source_weights(model, images, candidates={"prior_strength": (4.0,)},
                                    batch_size=8)
    assert set(only.readings["prior_strength"].agreement) == {4.0, 16.0}


@pytest.mark.parametrize("images, labels, message", [
    (random_images(4), None, r"n >= 5 \(one per shift\)"),
    (torch.rand(6, 8, 8), None, r"\(n, C, H, W\)"),
    (random_images(6), torch.zeros(5, dtype=torch.long), r"labels must be \(6,\)"),
])
def test_bad_input_is_one_clear_error(images, labels, message):
    with pytest.raises(ValueError, match=message):
        calibrate_source_weights(tiny_resnet(), images, labels)


def test_an_unknown_option_is_refused():
    with pytest.raises(ValueError, match=r"unknown option\(s\) alpha; fields of DYNAdaptiveConfig"):
        calibrate_source_weights(tiny_resnet(), random_images(6), candidates={"alpha": (0.5,)})
