"""``benchmarks/oracle_partition.py``: the domain oracle normalises each true domain of a batch
as if it came alone, at the source weight its label names, and each oracle is compared with
the method it improves on; the synthetic shifts are those named, and the synthetic agreement
is the model's own predictions with and without them, read on whole batches only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dyntta
from benchmarks.oracle_partition import (
    BATCH,
    DRAWS,
    SYNTHETIC,
    build,
    clean_stream,
    comparisons,
    first_images,
    main,
    synthetic_agreement,
    synthetic_shift,
)
from dyntta.methods.registry import method_class
from dyntta.norm import ClusterAwareBatchNorm2d
from tests.conftest import random_images, tiny_resnet


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    net = dyntta.models.build("resnet20")
    for m in net.modules():  # source statistics unlike any test batch's
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    return net.eval()


def forward(label, model, x, domains):
    adapted, oracle = build(label, model)
    oracle.show(domains)
    with torch.no_grad():
        return adapted(x)


@pytest.mark.parametrize("alpha", [0.0, 0.33])
def test_each_domain_is_normalised_as_if_alone(model, alpha):
    torch.manual_seed(1)
    x = torch.rand(6, 3, 32, 32)
    x[3:] = x[3:] * 0.3 + 0.6  # a second domain of another contrast and brightness
    domains = torch.tensor([0, 0, 0, 1, 1, 1])
    label = f"dyn+domains@{alpha:g}"
    together = forward(label, model, x, domains)
    alone = torch.cat([forward(label, model, x[:3], domains[:3]),
                       forward(label, model, x[3:], domains[3:])])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-4)
    # the partition matters: one cluster for all six gives other logits
    assert not torch.allclose(together, forward(label, model, x, torch.zeros(6, dtype=torch.long)),
                              atol=1e-3)


def test_the_label_sets_the_source_weight(model):
    for label, alpha in [("dyn+domains", 0.8), ("dyn+domains@0.25", 0.25)]:
        adapted, _ = build(label, model)
        layers = [m for m in adapted.modules() if isinstance(m, ClusterAwareBatchNorm2d)]
        assert len(layers) == 19 and {m.alpha for m in layers} == {alpha}


def test_each_oracle_beside_the_method_it_improves_on():
    assert comparisons(["tbn", "dyn+domains@0", "dyn+domains@0.5"]) == [
        ("dyn+domains@0", "tbn"), ("dyn+domains@0.5", "tbn")]
    assert comparisons(["dyn", "dyn_adaptive", "tbn", "dyn+domains", "deep+domains"]) == [
        ("dyn+domains", "dyn"), ("deep+domains", "dyn_adaptive")]
    assert comparisons(["dyn+domains", "deep+domains"]) == []


def test_agreement_under_one_batch_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["--agreement", "10"])
    assert "--agreement reads whole batches of 64 images, got 10" in capsys.readouterr().err


def test_the_clean_stream_holds_every_image_once_as_it_came():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (10, 4, 4, 3), dtype=np.uint8)
    y = np.arange(10) % 3
    batches = clean_stream((x, y), 4, seed=5)
    assert [len(b.y) for b in batches] == [4, 4, 2]
    images = torch.cat([b.x for b in batches])
    labels = torch.cat([b.y for b in batches])
    order = [int(np.flatnonzero((x == (image.permute(1, 2, 0) * 255).round().byte().numpy())
                                .all(axis=(1, 2, 3)))[0]) for image in images]
    assert sorted(order) == list(range(10)) and order != list(range(10))
    assert labels.tolist() == y[order].tolist()  # each image with its own label
    assert all(b.domain.eq(0).all() for b in batches)  # one domain
    again = clean_stream((x, y), 4, seed=5)
    assert all(torch.equal(a.x, b.x) for a, b in zip(batches, again))
    assert not torch.equal(clean_stream((x, y), 4, seed=6)[0].x, batches[0].x)


def test_clean_images_need_an_npz_file(capsys):
    with pytest.raises(SystemExit):
        main(["--dataset", "digits", "--scenarios", "clean"])
    assert "--scenarios clean reads the uncorrupted images of an npz file" in \
        capsys.readouterr().err


def test_first_images_keeps_the_streams_order():
    class Batch:
        def __init__(self, x):
            self.x = x
    stream = [Batch(torch.full((3, 1), float(i))) for i in range(4)]
    assert first_images(stream, 7).flatten().tolist() == [0, 0, 0, 1, 1, 1, 2]


def test_each_synthetic_shift_is_the_one_named():
    torch.manual_seed(2)
    x = torch.rand(5, 3, 8, 8) * 0.6 + 0.2
    shifted = synthetic_shift(x, torch.arange(5), torch.Generator().manual_seed(0))
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))[1]
    mean = x[3].mean()
    assert SYNTHETIC == ("none", "noise", "blur", "contrast", "brightness")
    assert torch.equal(shifted[0], x[0])
    torch.testing.assert_close(shifted[1], (x[1] + 0.1 * noise).clamp(0, 1))
    interior = sum(x[2, :, i:i + 6, j:j + 6] for i in range(3) for j in range(3)) / 9
    torch.testing.assert_close(shifted[2, :, 1:-1, 1:-1], interior)
    torch.testing.assert_close(shifted[2, :, 0, 0], (4 * x[2, :, 0, 0] + 2 * x[2, :, 0, 1]
                                                     + 2 * x[2, :, 1, 0] + x[2, :, 1, 1]) / 9)
    torch.testing.assert_close(shifted[3], (x[3] - mean) * 0.4 + mean)
    torch.testing.assert_close(shifted[4], (x[4] + 0.3).clamp(max=1))


def test_at_source_weight_one_the_agreement_is_the_source_models():
    """Weight 1 ignores the clusters: the share is how often the source model predicts the
    shifted images as the unshifted ones, shifts drawn as the reading draws them; images beyond
    the last whole batch are not read."""
    model, x = tiny_resnet(), random_images(BATCH + 9, seed=4)
    shares = synthetic_agreement(model, x, [0.0, 1.0], seed=7)
    generator = torch.Generator().manual_seed(7)
    kinds = [torch.randperm(BATCH, generator=generator) % 5 for _ in range(DRAWS)]
    shifted = [synthetic_shift(x[:BATCH], kind, generator) for kind in kinds]
    with torch.no_grad():
        reference = model(x[:BATCH]).argmax(1)
        alike = sum(int((model(s).argmax(1) == reference).sum()) for s in shifted)
    assert shares[1] == alike / (BATCH * DRAWS)
    assert shares[0] != shares[1]  # at weight 0 the batch statistics answer instead


def test_the_options_reach_dyn_adaptive_and_its_oracle_only(model):
    for label in ("dyn_adaptive", "deep+domains"):
        adapted, _ = build(label, model, {"neighbours": 3, "balanced_alpha": 0.0})
        assert (adapted.config.neighbours, adapted.config.balanced_alpha) == (3, 0.0)
        assert build(label, model)[0].config.neighbours == 8  # the default without
    adapted, _ = build("dyn", model, {"neighbours": 3})  # not dyn_adaptive's: not passed on
    assert isinstance(adapted, method_class("dyn"))


def test_options_that_are_not_a_json_object_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["--options", "[1]"])
    assert "--options takes a JSON object" in capsys.readouterr().err
