"""RoTTA: teacher predictions, update timing, the teacher's EMA and the weighted loss."""

import copy

import pytest
import torch

import dyntta
from dyntta.methods.augmentation import StrongAugmentation
from dyntta.methods.rotta import RoTTA, RoTTAConfig, timeliness
from dyntta.norm import RobustBatchNorm2d
from tests.conftest import random_images, tensor_state, tiny_resnet


def params(module):
    return [p.detach().clone() for p in module.parameters()]


def test_every_bn_is_robust_and_only_its_affine_parameters_train(tiny_model):
    method = dyntta.adapt(tiny_model, "rotta")
    layers = [m for m in method.model.modules() if isinstance(m, RobustBatchNorm2d)]
    assert layers and all(m.alpha == 0.05 for m in layers)
    trainable = {n for n, p in method.model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith((".weight", ".bias")) for n in trainable)
    assert trainable == set(method.adapted_names)
    assert not any(p.requires_grad for p in method.teacher.parameters())


def test_predictions_are_the_teachers_in_eval_mode():
    method = dyntta.adapt(tiny_resnet(), "rotta", update_every=8)
    for seed in range(3):
        x = random_images(12, seed)
        teacher = copy.deepcopy(method.teacher).eval()
        torch.testing.assert_close(method(x), teacher(x))


def test_updates_happen_every_update_every_samples_inside_batches():
    method = dyntta.adapt(tiny_resnet(), "rotta", update_every=32, memory_size=16)
    calls = []
    original = method.update

    def spy():
        calls.append((method.seen, len(method.memory)))
        original()

    method.update = spy
    for seed in range(4):
        method(random_images(20, seed))  # 80 samples: updates at 32 and 64
    assert [seen for seen, _ in calls] == [32, 64]
    assert all(0 < size <= 16 for _, size in calls)


def test_one_update_equals_a_reference_step_and_the_teacher_moves_by_the_ema_rule():
    """Rebuild the update by hand: strong augmentation with the same seed, timeliness weights,
    a gradient step on the BN affine parameters, then ``t = (1 - nu) t + nu s``. Plain SGD
    stands in for Adam on both sides (Adam's sign-like first step would turn float noise in
    near-zero gradients into full steps)."""
    nu = 0.3
    method = dyntta.adapt(tiny_resnet(), "rotta", update_every=16, nu=nu)
    assert isinstance(method.optimizer, torch.optim.Adam)
    assert method.optimizer.defaults["lr"] == 1e-3
    assert method.optimizer.defaults["betas"] == (0.9, 0.999)
    method.optimizer = torch.optim.SGD(method.adapted_parameters(), lr=0.5)
    x = random_images(16)
    student, teacher = copy.deepcopy(method.model), copy.deepcopy(method.teacher)
    teacher_before = params(method.teacher)
    method(x)

    # reference: the memory after the batch, then the update by hand
    images = method.memory.images()
    ages = torch.tensor(method.memory.ages(), dtype=torch.float32) / 64  # / capacity
    student.train()
    teacher.train()
    with torch.no_grad():
        target = teacher(images).softmax(1)
    out = student(StrongAugmentation(0)(images))
    weights = torch.exp(-ages) / (1 + torch.exp(-ages))
    loss = (-(target * out.log_softmax(1)).sum(1) * weights).mean()
    trainable = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=0.5)
    loss.backward()
    optimizer.step()
    for got, want in zip(method.model.parameters(), student.parameters()):
        torch.testing.assert_close(got, want)
    for got, before, s in zip(method.teacher.parameters(), teacher_before, student.parameters()):
        torch.testing.assert_close(got, (1 - nu) * before + nu * s)
    # both robust BNs saw the memory batch in training mode
    for got, want in zip(method.teacher.buffers(), teacher.buffers()):
        torch.testing.assert_close(got, want)


def test_prediction_leaves_the_robust_statistics_alone_until_an_update():
    method = dyntta.adapt(tiny_resnet(), "rotta", update_every=64)
    before = {k: v.clone() for k, v in tensor_state(method).items()}
    method(random_images(20))
    for k, v in tensor_state(method).items():
        assert torch.equal(v, before[k]), k


def test_timeliness_is_the_papers_weight():
    age = torch.tensor([0.0, 0.5, 2.0])
    torch.testing.assert_close(timeliness(age), torch.exp(-age) / (1 + torch.exp(-age)))
    assert timeliness(torch.tensor(0.0)) == 0.5


@pytest.mark.parametrize(
    "kwargs", [{"lr": 0.0}, {"memory_size": 0}, {"nu": 1.5}, {"alpha": -0.1}, {"lambda_t": -1}]
)
def test_bad_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        RoTTAConfig(**kwargs)


def test_config_defaults_are_the_papers():
    c = RoTTA.Config()
    assert (c.lr, c.memory_size, c.update_every, c.nu, c.alpha) == (1e-3, 64, 64, 0.001, 0.05)
