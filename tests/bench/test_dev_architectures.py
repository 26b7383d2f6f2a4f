"""The development architectures of ``benchmarks/dev_architectures.py``: their BN layers sit
where their names say, ``train_classifier`` trains a module of one's own, and a trained model's
state dict loads through the bring-your-own-model path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import dyntta
from benchmarks.dev_architectures import (
    FACTORIES, ConvMixer, DenseLayer, DenseNet, DepthwiseNet, DepthwiseResidual, PreActBlock,
    ResNet18Quarter, VGGBNAfterReLU, WideResNet, main)
from dyntta.bench.train import train_classifier
from dyntta.models.factory import build_from_factory


def bn_inputs(net: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    hooks = [m.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
             for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    net.eval()(x)
    for hook in hooks:
        hook.remove()
    return seen


def test_vgg_normalises_after_the_relu():
    inputs = bn_inputs(VGGBNAfterReLU(), torch.randn(4, 3, 32, 32))
    assert len(inputs) == 6
    assert all(t.min() >= 0 for t in inputs)  # every BN input is a ReLU's output


def test_depthwise_net_normalises_every_depthwise_and_pointwise_convolution():
    net = DepthwiseNet()
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    depthwise = [m for m in convs if m.groups == m.in_channels > 1]
    assert len(depthwise) == len(DepthwiseNet.BLOCKS) == 5
    inputs = bn_inputs(net, torch.randn(4, 3, 32, 32))
    assert len(inputs) == len(convs) == 11
    assert [t.shape[1] for t in inputs] == [m.out_channels for m in convs]
    assert inputs[-1].shape[2:] == (8, 8)


def test_wide_resnet_normalises_before_every_convolution_and_the_pooling():
    net = WideResNet()
    inputs = bn_inputs(net, torch.randn(4, 3, 32, 32))
    assert len(inputs) == 2 * 6 + 1 == 13
    assert [t.shape[2] for t in inputs] == [32] * 5 + [16] * 4 + [8] * 4  # pre-activation
    assert inputs[-1].shape[1] == 128
    assert any(t.min() < 0 for t in inputs[1:])  # residual sums, not ReLU outputs


def test_resnet18_quarter_has_four_stages_and_normalises_its_projection_shortcuts():
    net = ResNet18Quarter()
    inputs = bn_inputs(net, torch.randn(4, 3, 32, 32))
    assert len(inputs) == 1 + 8 * 2 + 3 == 20  # stem, two per block, three shortcuts
    assert [t.shape[2] for t in inputs] == [32] * 5 + [16] * 5 + [8] * 5 + [4] * 5
    assert [t.shape[1] for t in inputs][-5:] == [128] * 5


def test_convmixer_keeps_one_map_size_and_normalises_after_every_gelu():
    net = ConvMixer()
    inputs = bn_inputs(net, torch.randn(4, 3, 32, 32))
    assert len(inputs) == 1 + 2 * 6 == 13  # the patch embedding, two per block
    assert all(t.shape[1:] == (128, 16, 16) for t in inputs)  # no downsampling stage
    gelu_min = nn.functional.gelu(torch.tensor(-0.7518))  # GELU's minimum, about -0.17
    assert all(t.min() >= gelu_min - 1e-6 for t in inputs)
    assert all(t.min() < 0 for t in inputs)  # GELU outputs, not ReLU ones


def test_densenet_normalises_the_growing_concatenation_in_three_blocks():
    inputs = bn_inputs(DenseNet(), torch.randn(4, 3, 32, 32))
    assert len(inputs) == 3 * 4 * 2 + 2 + 1 == 27  # two per dense layer, transitions, the last
    assert [t.shape[2] for t in inputs] == [32] * 9 + [16] * 9 + [8] * 9
    first = [t.shape[1] for t in inputs[0:8:2]] + [t.shape[1] for t in inputs[9:17:2]] + \
        [t.shape[1] for t in inputs[18:26:2]]
    assert first == [24, 36, 48, 60, 36, 48, 60, 72, 42, 54, 66, 78]  # 12 more each layer
    assert [inputs[i].shape[1] for i in (8, 17, 26)] == [72, 84, 90]  # transitions, the last


def test_a_dense_layer_keeps_its_input_and_adds_growth_channels():
    torch.manual_seed(0)
    layer = DenseLayer(8, 4).eval()
    x = torch.randn(2, 8, 6, 6)
    out = layer(x)
    assert out.shape == (2, 12, 6, 6)
    torch.testing.assert_close(out[:, :8], x)
    torch.testing.assert_close(out[:, 8:], layer.new(x))


def test_a_depthwise_residual_adds_its_input():
    torch.manual_seed(0)
    block = DepthwiseResidual(8, 5).eval()
    x = torch.randn(2, 8, 6, 6)
    torch.testing.assert_close(block(x), x + block.mix[2](nn.functional.gelu(block.mix[0](x))))
    assert block.mix[0].groups == 8 and block.mix[0].kernel_size == (5, 5)


def test_a_preactivation_block_adds_its_input_or_its_projection():
    torch.manual_seed(0)
    same, wider = PreActBlock(8, 8, 1).eval(), PreActBlock(8, 16, 2).eval()
    x = torch.randn(2, 8, 8, 8)
    for block in (same, wider):
        residual = block.conv2(torch.relu(block.bn2(block.conv1(torch.relu(block.bn1(x))))))
        shortcut = x if block.shortcut is None else block.shortcut(torch.relu(block.bn1(x)))
        torch.testing.assert_close(block(x), residual + shortcut)
    assert same.shortcut is None and wider(x).shape == (2, 16, 4, 4)


def test_train_classifier_trains_a_module_of_ones_own_deterministically():
    rng = np.random.default_rng(0)
    y = np.arange(48) % 2
    x = np.where(y[:, None, None, None] == 1, 200, 40).astype(np.uint8) + \
        rng.integers(0, 30, (48, 32, 32, 3), dtype=np.uint8)
    weights = []
    for _ in range(2):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
        model = train_classifier(x, y, net, epochs=3, batch_size=16, progress=False)
        assert model.net is net
        weights.append(torch.cat([p.flatten() for p in model.parameters()]))
        with torch.no_grad():
            pred = model(torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255).argmax(1)
        assert (pred.numpy() == y).mean() == 1.0
    assert torch.equal(*weights)


def test_the_script_writes_a_test_half_and_checkpoints_the_factories_load(tmp_path, capsys):
    rng = np.random.default_rng(1)
    npz = tmp_path / "images.npz"
    x = rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8)
    np.savez(npz, x=x, y=np.arange(40) // 4)  # sorted by class, as the CIFAR-10 npz
    main([str(npz), "--out", str(tmp_path / "out"), "--epochs", "1", "--models", "depthwise_net"])
    half = np.load(tmp_path / "out" / "cifar10-test-half.npz")
    assert np.array_equal(half["x"], x[1::2])  # the odd rows, every class twice
    assert list(half["y"]) == [c for c in range(10) for _ in range(2)]
    model = build_from_factory("benchmarks.dev_architectures:depthwise_net",
                               tmp_path / "out" / "depthwise_net.pt")
    assert not torch.equal(model.mean, FACTORIES["depthwise_net"]().mean)  # the trained one's
    assert "depthwise_net: clean accuracy on the test half" in capsys.readouterr().out
    adapted = dyntta.adapt(model, "dyn_adaptive")
    assert adapted(torch.rand(8, 3, 32, 32)).shape == (8, 10)


def test_the_script_trains_on_the_threads_asked_and_gives_the_count_back(tmp_path, monkeypatch):
    import benchmarks.dev_architectures as script

    seen = []

    def record(x, y, net, **kwargs):
        seen.append(torch.get_num_threads())
        return script.Normalized(net, [0.5] * 3, [0.25] * 3)

    monkeypatch.setattr(script, "train_classifier", record)
    npz = tmp_path / "images.npz"
    np.savez(npz, x=np.zeros((20, 32, 32, 3), np.uint8), y=np.arange(20) // 2)
    before = torch.get_num_threads()
    out = str(tmp_path / "out")
    main([str(npz), "--out", out, "--models", "vgg_bn_after_relu"])
    main([str(npz), "--out", out, "--models", "vgg_bn_after_relu", "--threads", "3"])
    assert seen == [1, 3]  # one thread unless asked: the same CPU trains the same weights
    assert torch.get_num_threads() == before
    with pytest.raises(SystemExit):
        main([str(npz), "--out", out, "--threads", "0"])
