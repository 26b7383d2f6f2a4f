"""The standard TTA source models: RobustBench's Wide ResNets, AugMix's ResNeXt, TTAB's ResNet-26.

Reference facts: parameter counts (closed-form, and the WRN paper's Table 1), the names and shapes
of RobustBench's / AugMix's / TTAB's state dicts, their input normalisation, and forward passes
written out here from the published code's structure with functional ops on the state dict.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import dyntta
from dyntta.models import (
    ARCHITECTURES,
    CifarResNeXt,
    ResNeXtSpec,
    WideResNet,
    WideResNetSpec,
    build,
    build_net,
    infer_spec,
    load_checkpoint,
    save_checkpoint,
)
from tests.conftest import randomize_bn


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def randomise_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return randomize_bn(model)


def wrn_params(depth: int, k: int, classes: int) -> int:
    """Closed form: stem 3x3x3x16; per stage n blocks of two 3x3 convs and two BNs (pre-act),
    a 1x1 shortcut in each stage's first block (widths change in all three stages); final BN; fc."""
    n = (depth - 4) // 6
    widths = [16, 16 * k, 32 * k, 64 * k]
    total = 27 * 16
    for s in range(3):
        cin, cout = widths[s], widths[s + 1]
        total += 2 * cin + 9 * cin * cout + 2 * cout + 9 * cout * cout + cin * cout  # first block
        total += (n - 1) * (2 * cout + 9 * cout * cout + 2 * cout + 9 * cout * cout)
    return total + 2 * widths[3] + widths[3] * classes + classes


def resnext_params(depth: int, cardinality: int, base_width: int, classes: int) -> int:
    """Closed form for AugMix's CifarResNeXt: 3x3 stem to 64 + BN; per stage n bottlenecks with
    D = cardinality * planes * base_width / 64 inner channels (grouped 3x3 has 9 D^2 / card
    weights), 1x1 + BN projection in each stage's first block; linear 1024 -> classes."""
    n = (depth - 2) // 9
    total, cin = 27 * 64 + 2 * 64, 64
    for planes in (64, 128, 256):
        d, out = cardinality * planes * base_width // 64, 4 * planes
        for j in range(n):
            total += cin * d + 2 * d + 9 * d * d // cardinality + 2 * d + d * out + 2 * out
            if j == 0:
                total += cin * out + 2 * out
            cin = out
    return total + 1024 * classes + classes


@pytest.mark.parametrize(
    "arch, classes, published_millions",
    [("wrn28-10", 10, 36.5), ("wrn40-2", 10, 2.2), ("resnext29", 10, 6.8)],
)
def test_parameter_counts_match_closed_forms_and_published_sizes(arch, classes, published_millions):
    """WRN-28-10 36.5M and WRN-40-2 2.2M: Zagoruyko & Komodakis 2016, Table 1. ResNeXt-29 with
    AugMix's cardinality 4 / base width 32: 6.8M (the 32x4d grouping would have 4.8M)."""
    spec = ARCHITECTURES[arch]
    model = build(arch, num_classes=classes)
    expected = (
        wrn_params(spec.depth, spec.widen_factor, classes)
        if isinstance(spec, WideResNetSpec)
        else resnext_params(spec.depth, spec.cardinality, spec.base_width, classes)
    )
    assert n_params(model) == expected
    assert round(n_params(model) / 1e6, 1) == published_millions
    assert n_params(CifarResNeXt(ResNeXtSpec(29, 32, 4), 10)) == resnext_params(29, 32, 4, 10)


def test_wrn28_10_has_robustbench_names_and_shapes():
    """RobustBench ``WideResNet(depth=28, widen_factor=10)``: 4 blocks per stage, 160/320/640."""
    state = build("wrn28-10").state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes["conv1.weight"] == (16, 3, 3, 3)
    assert shapes["block1.layer.0.bn1.weight"] == (16,)
    assert shapes["block1.layer.0.conv1.weight"] == (160, 16, 3, 3)
    assert shapes["block1.layer.0.convShortcut.weight"] == (160, 16, 1, 1)
    assert shapes["block2.layer.0.convShortcut.weight"] == (320, 160, 1, 1)
    assert shapes["block3.layer.3.conv2.weight"] == (640, 640, 3, 3)
    assert shapes["bn1.running_var"] == (640,) and shapes["fc.weight"] == (10, 640)
    assert "fc.bias" in shapes and "block1.layer.1.convShortcut.weight" not in shapes
    assert {k.split(".")[0] for k in shapes} == {"conv1", "block1", "block2", "block3", "bn1", "fc"}
    assert sum(k.endswith("convShortcut.weight") for k in shapes) == 3
    assert sum(isinstance(m, nn.BatchNorm2d) for m in build("wrn28-10").modules()) == 3 * 4 * 2 + 1


def test_resnext29_has_augmix_names_and_shapes():
    """AugMix ``resnext29(cardinality=4, base_width=32)``: 3 blocks per stage, 128/256/512 inner
    channels in 4 groups, 256/512/1024 outputs."""
    state = build("resnext29", num_classes=100).state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes["conv_1_3x3.weight"] == (64, 3, 3, 3) and shapes["bn_1.weight"] == (64,)
    assert shapes["stage_1.0.conv_reduce.weight"] == (128, 64, 1, 1)
    assert shapes["stage_1.0.conv_conv.weight"] == (128, 32, 3, 3)
    assert shapes["stage_1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert shapes["stage_1.0.downsample.1.running_mean"] == (256,)
    assert shapes["stage_2.0.conv_conv.weight"] == (256, 64, 3, 3)
    assert shapes["stage_3.2.conv_expand.weight"] == (1024, 512, 1, 1)
    assert shapes["classifier.weight"] == (100, 1024) and shapes["classifier.bias"] == (100,)
    assert "stage_1.1.downsample.0.weight" not in shapes
    assert sum(k.endswith("downsample.0.weight") for k in shapes) == 3


def bn(x, state, prefix):
    return F.batch_norm(x, state[f"{prefix}.running_mean"], state[f"{prefix}.running_var"],
                        state[f"{prefix}.weight"], state[f"{prefix}.bias"], False, 0.0, 1e-5)


def wrn_reference(state, x):
    """RobustBench's WideResNet forward, step by step, from the state dict."""
    out = F.conv2d(x, state["conv1.weight"], padding=1)
    for stage in (1, 2, 3):
        j = 0
        while f"block{stage}.layer.{j}.conv1.weight" in state:
            p = f"block{stage}.layer.{j}"
            stride = 2 if stage > 1 and j == 0 else 1
            equal = state[f"{p}.conv1.weight"].shape[0] == state[f"{p}.conv1.weight"].shape[1]
            act = F.relu(bn(out, state, f"{p}.bn1"))
            h = F.relu(bn(F.conv2d(act, state[f"{p}.conv1.weight"], stride=stride, padding=1),
                          state, f"{p}.bn2"))
            h = F.conv2d(h, state[f"{p}.conv2.weight"], padding=1)
            out = (out if equal else F.conv2d(act, state[f"{p}.convShortcut.weight"], stride=stride)) + h
            j += 1
    out = F.avg_pool2d(F.relu(bn(out, state, "bn1")), 8)
    return F.linear(out.flatten(1), state["fc.weight"], state.get("fc.bias"))


def resnext_reference(state, x, cardinality):
    """AugMix's CifarResNeXt forward, step by step, from the state dict."""
    out = F.relu(bn(F.conv2d(x, state["conv_1_3x3.weight"], padding=1), state, "bn_1"))
    for stage in (1, 2, 3):
        j = 0
        while f"stage_{stage}.{j}.conv_reduce.weight" in state:
            p = f"stage_{stage}.{j}"
            stride = 2 if stage > 1 and j == 0 else 1
            h = F.relu(bn(F.conv2d(out, state[f"{p}.conv_reduce.weight"]), state, f"{p}.bn_reduce"))
            h = F.conv2d(h, state[f"{p}.conv_conv.weight"], stride=stride, padding=1, groups=cardinality)
            h = F.relu(bn(h, state, f"{p}.bn"))
            h = bn(F.conv2d(h, state[f"{p}.conv_expand.weight"]), state, f"{p}.bn_expand")
            if f"{p}.downsample.0.weight" in state:
                out = bn(F.conv2d(out, state[f"{p}.downsample.0.weight"], stride=stride), state,
                         f"{p}.downsample.1")
            out = F.relu(out + h)
            j += 1
    out = F.avg_pool2d(out, 8).flatten(1)
    return F.linear(out, state["classifier.weight"], state["classifier.bias"])


@pytest.mark.parametrize("spec", [WideResNetSpec(10, 2), WideResNetSpec(16, 1, head_bias=False)])
def test_wide_resnet_forward_equals_robustbench_reference(spec):
    model = randomise_bn(WideResNet(spec, num_classes=5))
    x = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), wrn_reference(model.state_dict(), x))


@pytest.mark.parametrize("spec", [ResNeXtSpec(11, 2, 8), ResNeXtSpec(20, 4, 4)])
def test_resnext_forward_equals_augmix_reference(spec):
    model = randomise_bn(CifarResNeXt(spec, num_classes=7))
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), resnext_reference(model.state_dict(), x, spec.cardinality))


@pytest.mark.parametrize(
    "spec", [WideResNetSpec(10, 2), WideResNetSpec(16, 4, head_bias=False), ResNeXtSpec(11, 2, 8),
             ResNeXtSpec(20, 8, 4)],
)
def test_infer_spec_recovers_custom_wide_resnets_and_resnexts(spec):
    assert infer_spec(build_net(spec, 3).state_dict()) == spec


def robustbench_file(tmp_path, arch, classes, seed=0):
    """A state dict as RobustBench stores it: ``{"state_dict": {"module.<name>": ...}}``, no
    ``num_batches_tracked``; returns the path and the network it came from."""
    net = randomise_bn(build(arch, num_classes=classes), seed)
    state = {f"module.{k}": v for k, v in net.state_dict().items() if "num_batches" not in k}
    torch.save({"state_dict": state}, tmp_path / f"{arch}.pt")
    return tmp_path / f"{arch}.pt", net


@pytest.mark.parametrize(
    "arch, classes, mean, std",
    [("wrn40-2", 100, 0.5, 0.5), ("resnext29", 100, 0.5, 0.5)],
)
def test_robustbench_state_dicts_load_with_their_normalisation(tmp_path, arch, classes, mean, std):
    path, net = robustbench_file(tmp_path, arch, classes)
    model = load_checkpoint(path)
    assert model.net.spec == ARCHITECTURES[arch]
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), net((x - mean) / std))


def test_standard_wrn28_10_takes_inputs_without_normalisation(tmp_path):
    """RobustBench's CIFAR-10 ``Standard``: ``WideResNet(depth=28, widen_factor=10)``, no
    normalisation layer, so inputs in [0, 1] go in as they are. Stored with ``model.`` keys."""
    net = randomise_bn(build("wrn28-10"))
    torch.save({f"model.{k}": v for k, v in net.state_dict().items()}, tmp_path / "standard.pt")
    model = load_checkpoint(tmp_path / "standard.pt")
    assert model.net.spec == WideResNetSpec(28, 10)
    assert model.mean.flatten().tolist() == [0.0] * 3 and model.std.flatten().tolist() == [1.0] * 3
    x = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), wrn_reference(net.state_dict(), x))


def ttab_names(state: dict) -> dict:
    """dyntta -> TTAB ``ResNetCifar`` names: only the classifier differs."""
    return {("classifier." + k[len("linear."):] if k.startswith("linear.") else k): v
            for k, v in state.items()}


@pytest.mark.parametrize(
    "classes, mean, std",
    [(10, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
     (100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))],
)
def test_ttab_resnet26_checkpoint_loads_as_saved_by_ttab(tmp_path, classes, mean, std):
    """TTAB's ``ssl_pretrain.py`` saves ``{"model": ..., "head": ..., "optimizer": ...}``;
    ``ResNetCifar(depth=26)`` names its bias-free classifier ``classifier``. TTAB's CIFAR
    statistics (ttab/configs/datasets.py) are the default normalisation."""
    net = randomise_bn(build("resnet26", num_classes=classes))
    state = ttab_names(net.state_dict())
    assert "classifier.weight" in state and "classifier.bias" not in state
    blob = {"model": state, "head": {"fc.weight": torch.zeros(4, 64)},
            "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}}
    torch.save(blob, tmp_path / "rn26_bn.pth")
    model = load_checkpoint(tmp_path / "rn26_bn.pth")
    assert model.net.spec == ARCHITECTURES["resnet26"]
    torch.testing.assert_close(model.mean.flatten(), torch.tensor(mean), atol=1e-4, rtol=0)
    torch.testing.assert_close(model.std.flatten(), torch.tensor(std), atol=1e-4, rtol=0)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), net((x - model.mean) / model.std))


def test_load_errors_name_what_is_wrong(tmp_path):
    path, _ = robustbench_file(tmp_path, "wrn40-2", 10)
    state = torch.load(path)["state_dict"]
    state["module.block2.layer.0.conv1.weight"] = torch.zeros(64, 32, 5, 5)
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"shape mismatches \['block2.layer.0.conv1.weight"):
        load_checkpoint(tmp_path / "bad.pt")
    state = torch.load(path)["state_dict"]
    state["module.sub_block1.layer.0.conv1.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "sub.pt")
    with pytest.raises(ValueError, match=r"unexpected keys \['sub_block1.layer.0.conv1.weight'\]"):
        load_checkpoint(tmp_path / "sub.pt")
    with pytest.raises(ValueError, match=r"no classifier weights 'classifier.weight'"):
        load_checkpoint(path, arch="resnext29")
    torch.save(build_net(WideResNetSpec(10, 1), 10).state_dict(), tmp_path / "custom.pt")
    with pytest.raises(ValueError, match="carries no input normalisation; pass mean"):
        load_checkpoint(tmp_path / "custom.pt")
    assert load_checkpoint(tmp_path / "custom.pt", mean=(0.1,) * 3, std=(0.2,) * 3).net.spec == \
        WideResNetSpec(10, 1)
    state = build("resnext29").state_dict()
    state["stage_1.0.conv_conv.weight"] = torch.zeros(128, 48, 3, 3)
    with pytest.raises(ValueError, match="128 not a multiple of 48"):
        infer_spec(state)
    with pytest.raises(ValueError, match="depth must be 6n \\+ 4"):
        WideResNetSpec(27, 10)
    with pytest.raises(ValueError, match="depth must be 9n \\+ 2"):
        ResNeXtSpec(30)


def test_save_and_load_round_trip_of_a_wide_resnet(tmp_path):
    model = dyntta.models.Normalized(randomise_bn(build_net(WideResNetSpec(10, 2), 4)),
                                     (0.5,) * 3, (0.5,) * 3).eval()
    save_checkpoint(model, tmp_path / "w.pt", classes=list("abcd"))
    loaded = load_checkpoint(tmp_path / "w.pt")
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model(x))
    assert loaded.classes == list("abcd") and loaded.net.spec == WideResNetSpec(10, 2)


def test_methods_adapt_the_new_architectures_without_touching_the_source():
    model = dyntta.models.Normalized(randomise_bn(build_net(ResNeXtSpec(11, 2, 8), 5)),
                                     (0.5,) * 3, (0.5,) * 3).eval()
    x = torch.rand(8, 3, 32, 32)
    with torch.no_grad():
        source = model(x)
        torch.testing.assert_close(dyntta.adapt(model, "source")(x), source)
        tbn = dyntta.adapt(model, "tbn")(x)
    assert not torch.allclose(tbn, source)
    torch.testing.assert_close(model(x), source)  # adapt works on a copy
