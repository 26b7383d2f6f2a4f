"""NOTE: IABN in every BN layer, batch-free predictions, entropy updates on the PBRS memory."""

import copy

import pytest
import torch

import dyntta
from dyntta.methods.note import NOTEConfig
from dyntta.norm import InstanceAwareBatchNorm2d
from tests.conftest import random_images, tensor_state, tiny_resnet


def test_every_bn_becomes_iabn_with_notes_settings_and_adam(tiny_model):
    method = dyntta.adapt(tiny_model, "note")
    layers = [m for m in method.model.modules() if isinstance(m, InstanceAwareBatchNorm2d)]
    assert layers
    assert all((m.k, m.reference, m.momentum) == (4.0, "mode", 0.01) for m in layers)
    trainable = {n for n, p in method.model.named_parameters() if p.requires_grad}
    assert trainable == set(method.adapted_names)
    assert all(n.endswith((".weight", ".bias")) for n in trainable)
    assert isinstance(method.optimizer, torch.optim.Adam)
    assert method.optimizer.defaults["lr"] == 1e-4


def test_predictions_are_batch_free_between_updates():
    """In eval mode IABN shrinks towards the running statistics: a sample's prediction does not
    depend on the other samples of its batch."""
    x = random_images(12)
    whole = dyntta.adapt(tiny_resnet(), "note")(x)
    part = dyntta.adapt(tiny_resnet(), "note")(x[:5])
    torch.testing.assert_close(whole[:5], part)


def test_update_is_the_mean_entropy_over_samples_and_classes_in_training_mode():
    """One update by hand on the memory: IABN in training mode (batch reference, running
    statistics moved by 0.01), loss ``mean(-p log(p + 1e-6))`` over the (N, K) matrix. Plain SGD
    stands in for Adam on both sides (Adam's first step is sign-like)."""
    method = dyntta.adapt(tiny_resnet(), "note", update_every=16, memory_size=16)
    method.optimizer = torch.optim.SGD(method.adapted_parameters(), lr=0.5)
    reference = copy.deepcopy(method.model)
    method(random_images(16))
    reference.train()
    probs = reference(method.memory.images()).softmax(1)
    loss = (-probs * torch.log(probs + 1e-6)).mean()
    loss.backward()
    torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=0.5).step()
    for (name, got), want in zip(method.model.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(got, want, msg=name)
    assert not method.model.training


def test_an_update_inside_a_batch_applies_to_the_rest_of_the_batch():
    method = dyntta.adapt(tiny_resnet(), "note", update_every=16, memory_size=16)
    before = copy.deepcopy(method.model)
    x = random_images(24)
    out = method(x)
    torch.testing.assert_close(out[:16], before(x[:16]))
    torch.testing.assert_close(out[16:], method.model(x[16:]))
    assert not torch.allclose(out[16:], before(x[16:]))
    assert method.seen == 24 and len(method.memory) == 16


def test_no_update_before_update_every_samples():
    method = dyntta.adapt(tiny_resnet(), "note")
    before = {k: v.clone() for k, v in tensor_state(method).items()}
    method(random_images(40))
    assert all(torch.equal(v, before[k]) for k, v in tensor_state(method).items())
    assert len(method.memory) == 40


@pytest.mark.parametrize(
    "kwargs", [{"lr": -1.0}, {"update_every": 0}, {"k": -1.0}, {"bn_momentum": 2.0}]
)
def test_bad_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        NOTEConfig(**kwargs)


def test_predictions_do_not_depend_on_how_the_stream_is_batched():
    """The same 150 samples in batches of 150, 64, 10 and 7 (updates every 64 samples fall
    inside batches differently): the same logits for every sample. This is why NOTE is immune
    to mixed batches, as docs/methods.md and ``dyntta methods`` say."""
    x = random_images(150)
    outputs = []
    for size in (150, 64, 10, 7):
        method = dyntta.adapt(tiny_resnet(), "note")
        outputs.append(torch.cat([method(x[i : i + size]) for i in range(0, 150, size)]))
        assert method.seen == 150
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(outputs[0][100:], dyntta.adapt(tiny_resnet(), "note")(x[100:]))
