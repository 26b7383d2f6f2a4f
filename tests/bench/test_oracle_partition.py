"""``benchmarks/oracle_partition.py``: the domain oracle normalises each true domain of a batch
as if it came alone, at the source weight its label names, and each oracle is compared with
the method it improves on, and the synthetic agreement reads only whole batches."""

from __future__ import annotations

import pytest
import torch

import dyntta
from benchmarks.oracle_partition import build, comparisons, first_images, main
from dyntta.norm import ClusterAwareBatchNorm2d


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


def test_first_images_keeps_the_streams_order():
    class Batch:
        def __init__(self, x):
            self.x = x
    stream = [Batch(torch.full((3, 1), float(i))) for i in range(4)]
    assert first_images(stream, 7).flatten().tolist() == [0, 0, 0, 1, 1, 1, 2]
