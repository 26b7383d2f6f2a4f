"""EATA: reliable and non-redundant sample selection, entropy weighting, the stream Fisher."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

import dyntta
from tests.conftest import random_images
from tests.methods.gradient_reference import (
    assert_params_equal,
    bn_params,
    confident_resnet,
    current,
    entropy,
    grads,
    midpoint,
    reference_model,
)

B, C, LR = 16, 3, 1e-2


def eata_loss(logits, mask, e0):
    """Mean over selected samples of exp(E0 - E) * E, weights detached (EATA Eqn. 6)."""
    e = entropy(logits)[mask]
    return (torch.exp(e0 - e.detach()) * e).mean()


def test_first_batch_keeps_only_low_entropy_samples():
    model = confident_resnet()
    x = random_images(B, 0)
    ref = reference_model(model)
    params = bn_params(ref)
    logits = ref(x)
    k = 6
    e0 = midpoint(entropy(logits), k)
    margin = e0 / math.log(C)
    reliable = entropy(logits) < e0
    assert int(reliable.sum()) == k

    eata = dyntta.adapt(model, "eata", lr=LR, margin=margin, fisher="off")
    eata(x)
    assert (eata.num_reliable, eata.num_selected) == (k, k)
    g = grads(eata_loss(logits, reliable, e0), params)
    # first SGD step with momentum: buffer = g
    expected = {n: p.detach() - LR * g[n] for n, p in params.items()}
    assert_params_equal(eata, expected, atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(eata.mean_probs, logits.softmax(1)[reliable].mean(0).detach())


def run_two_batches(model, margin, d_margin, **options):
    eata = dyntta.adapt(model, "eata", lr=LR, margin=margin, d_margin=d_margin, **options)
    eata(random_images(B, 0))
    after_first = current(eata)
    mean_probs = eata.mean_probs.clone()
    eata(random_images(B, 1))
    return eata, after_first, mean_probs


def test_redundant_samples_are_dropped_by_cosine_similarity_to_the_moving_average():
    model = confident_resnet()
    margin = 0.9  # E0 = 0.9 ln 3: most samples reliable
    probe, after_first, m1 = run_two_batches(model, margin, 1.0, fisher="off")
    ref = reference_model(model, after_first)
    params = bn_params(ref)
    logits = ref(random_images(B, 1))
    reliable = entropy(logits) < margin * math.log(C)
    cos = F.cosine_similarity(m1[None], logits.softmax(1).detach(), dim=1).abs()
    k = 4  # keep the k reliable samples least similar to the moving average
    d_margin = midpoint(cos[reliable], k)
    selected = reliable & (cos < d_margin)
    assert int(selected.sum()) == k < int(reliable.sum())

    eata, after_first_again, _ = run_two_batches(model, margin, d_margin, fisher="off")
    for name, value in after_first.items():  # d_margin plays no part on the first batch
        assert torch.equal(after_first_again[name], value)
    first_batch_selected = eata.num_reliable - int(reliable.sum())  # = its reliable samples
    assert eata.num_reliable == probe.num_reliable
    assert eata.num_selected == first_batch_selected + k
    # second step: buffer = 0.9 * g1 + g2, where the first step was theta1 = theta0 - lr * g1
    source = bn_params(reference_model(model))
    g1 = {n: (source[n].detach() - after_first[n]) / LR for n in params}
    g2 = grads(eata_loss(logits, selected, margin * math.log(C)), params)
    expected = {n: after_first[n] - LR * (0.9 * g1[n] + g2[n]) for n in params}
    assert_params_equal(eata, expected, atol=1e-6, rtol=1e-4)
    expected_m = 0.9 * m1 + 0.1 * logits.softmax(1)[selected].mean(0).detach()
    torch.testing.assert_close(eata.mean_probs, expected_m)


def test_no_update_at_all_when_every_sample_is_redundant():
    model = confident_resnet()
    eata, after_first, m1 = run_two_batches(model, 0.9, 1e-9, fisher="off")
    assert eata.num_selected < eata.num_reliable
    for name, value in current(eata).items():  # no step: not even momentum moves them
        assert torch.equal(value, after_first[name]), name
    assert torch.equal(eata.mean_probs, m1)


def test_stream_fisher_is_the_mean_squared_pseudo_label_gradient_and_regularises():
    model = confident_resnet()
    alpha = 50.0
    eata, after_first, _ = run_two_batches(
        model, margin=1.0, d_margin=1.0, fisher="stream", fisher_size=B, fisher_alpha=alpha
    )
    ref = reference_model(model)
    params = bn_params(ref)
    logits0 = ref(random_images(B, 0))
    g_ce = grads(F.cross_entropy(logits0, logits0.argmax(1)), params)
    assert eata.fisher_batches == 1 and eata.fisher is not None
    for name, f in zip(eata.adapted_names, eata.fisher):
        torch.testing.assert_close(f, g_ce[name].square(), msg=name)
    for name, a in zip(eata.adapted_names, eata.anchors):
        assert torch.equal(a, params[name].detach()), name

    # second batch: every sample selected, loss = weighted entropy + alpha * sum F (theta - src)^2
    g1 = {n: (params[n].detach() - after_first[n]) / LR for n in params}
    ref1 = reference_model(model, after_first)
    params1 = bn_params(ref1)
    logits1 = ref1(random_images(B, 1))
    penalty = sum(
        (g_ce[n].square() * (params1[n] - params[n].detach()).square()).sum() for n in params1
    )
    everything = torch.ones(B, dtype=torch.bool)
    assert eata.num_selected == 2 * B
    g2 = grads(eata_loss(logits1, everything, math.log(C)) + alpha * penalty, params1)
    g_penalty = grads(alpha * penalty, params1)
    assert max(float(g.abs().max()) for g in g_penalty.values()) > 1e-2  # the penalty matters
    expected = {n: after_first[n] - LR * (0.9 * g1[n] + g2[n]) for n in params}
    assert_params_equal(eata, expected, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("fisher_size, batches_needed", [(B, 1), (2 * B, 2), (2 * B + 1, 3)])
def test_fisher_is_complete_once_fisher_size_samples_were_seen(fisher_size, batches_needed):
    eata = dyntta.adapt(confident_resnet(), "eata", fisher_size=fisher_size)
    for i in range(batches_needed):
        assert eata.fisher is None
        eata(random_images(B, i))
    assert eata.fisher is not None and eata.fisher_batches == batches_needed
    eata(random_images(B, 9))
    assert eata.fisher_batches == batches_needed  # estimation stops


def test_fisher_off_never_estimates():
    eata = dyntta.adapt(confident_resnet(), "eata", fisher="off", fisher_size=1)
    for i in range(3):
        eata(random_images(B, i))
    assert eata.fisher is None and eata.fisher_batches == 0


class EvenBatchHead(torch.nn.Module):
    """A BN layer that runs only on batches of an even size (another on odd ones)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.even, self.odd = torch.nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, C)

    def forward(self, x):
        x = self.conv(x)
        x = self.even(x) if x.shape[0] % 2 == 0 else self.odd(x)
        return self.fc(x.relu().mean((2, 3)))


def test_stream_fisher_counts_zero_for_a_layer_the_batch_did_not_reach():
    torch.manual_seed(0)
    model = EvenBatchHead().eval()
    eata = dyntta.adapt(model, "eata", margin=1e9, d_margin=1.0, fisher_size=B + 3)
    eata(random_images(B, 0))
    ref = reference_model(model)
    logits = ref(random_images(B, 0))
    even = {n: q for n, q in bn_params(ref).items() if n.startswith("even")}
    expected = grads(F.cross_entropy(logits, logits.argmax(1)), even)
    eata(random_images(3, 1))  # the odd layer runs; the even layer's square is 0 here
    assert eata.fisher_batches == 2 and eata.fisher is not None
    fisher = dict(zip(eata.adapted_names, eata.fisher))
    for name in ("even.weight", "even.bias"):
        torch.testing.assert_close(fisher[name], expected[name].square() / 2, msg=name)
    assert all(f.abs().max() > 0 for name, f in fisher.items() if name.startswith("odd"))
