"""Architectures, architecture inference and checkpoint loading."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

import dyntta
from dyntta.models import (
    ARCHITECTURES,
    Normalized,
    build,
    infer_spec,
    load_checkpoint,
    save_checkpoint,
)
from dyntta.models.checkpoint import from_torchvision_names


def count(model, kind):
    return sum(isinstance(m, kind) for m in model.modules())


@pytest.mark.parametrize(
    "arch, convs, params",
    [("resnet20", 19, 269_722), ("resnet32", 31, 464_154), ("resnet56", 55, 853_018)],
)
def test_cifar_resnets_have_the_published_depth_and_size(arch, convs, params):
    """He et al. 2016, Table 6: ResNet-20 0.27M, -32 0.46M, -56 0.85M parameters."""
    model = build(arch)
    assert count(model, nn.Conv2d) == convs
    assert sum(p.numel() for p in model.parameters()) == params
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_resnet26_is_ttab_layout_and_resnet50_is_bottleneck():
    r26 = build("resnet26")
    assert count(r26, nn.Conv2d) == 1 + 24 + 2  # stem, 12 blocks x 2, 2 projection shortcuts
    assert r26.linear.bias is None
    r50 = build("resnet50", num_classes=100)
    assert count(r50, nn.BatchNorm2d) == 1 + 16 * 3 + 4
    assert not any(isinstance(m, nn.MaxPool2d) for m in r50.modules())
    assert r50(torch.rand(2, 3, 32, 32)).shape == (2, 100)


@pytest.mark.parametrize(
    "arch, params",
    [("resnet18-imagenet", 11_689_512), ("resnet34-imagenet", 21_797_672),
     ("resnet50-imagenet", 25_557_032)],
)
def test_imagenet_resnets_have_torchvisions_parameter_counts(arch, params):
    """torchvision's model docs: ResNet-18 11,689,512, -34 21,797,672, -50 25,557,032."""
    model = build(arch, num_classes=1000)
    assert sum(p.numel() for p in model.parameters()) == params
    assert count(model, nn.MaxPool2d) == 1


def torchvision_names(state: dict) -> dict:
    """dyntta -> torchvision ResNet names, written out independently of the loader's table."""
    out = {}
    for key, value in state.items():
        if key.startswith("linear."):
            key = "fc." + key[len("linear."):]
        key = key.replace("downsample.conv.", "downsample.0.")
        key = key.replace("downsample.bn.", "downsample.1.")
        out[key] = value
    return out


def test_torchvision_resnet_state_dict_loads_with_imagenet_normalisation(tmp_path):
    net = build("resnet18-imagenet", num_classes=7).eval()
    state = torchvision_names(net.state_dict())
    assert {"fc.weight", "layer2.0.downsample.0.weight", "layer4.1.bn2.running_var"} <= set(state)
    assert tuple(state["conv1.weight"].shape) == (64, 3, 7, 7)
    torch.save(state, tmp_path / "resnet18.pth")
    loaded = load_checkpoint(tmp_path / "resnet18.pth")
    assert loaded.net.spec == ARCHITECTURES["resnet18-imagenet"]
    x = torch.rand(2, 3, 64, 64)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), net((x - mean) / std))
    bottleneck = torchvision_names(build("resnet50-imagenet").state_dict())
    assert infer_spec(from_torchvision_names(bottleneck)) == ARCHITECTURES["resnet50-imagenet"]


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_infer_spec_recovers_every_architecture(arch):
    assert infer_spec(build(arch).state_dict()) == ARCHITECTURES[arch]


def test_save_and_load_round_trip_keeps_weights_classes_and_normalisation(tmp_path):
    model = Normalized(build("resnet26", num_classes=4), (0.1, 0.2, 0.3), (0.4, 0.5, 0.6)).eval()
    path = tmp_path / "m.pt"
    save_checkpoint(model, path, classes=["a", "b", "c", "d"])
    loaded = load_checkpoint(path)
    x = torch.rand(3, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model(x))
    assert loaded.classes == ["a", "b", "c", "d"]
    assert loaded.mean.flatten().tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt"]  # no temporary file left behind


def test_bare_state_dict_with_module_prefix_and_no_batch_counters_loads(tmp_path):
    net = build("resnet20")
    state = {f"module.{k}": v for k, v in net.state_dict().items() if "num_batches" not in k}
    torch.save({"state_dict": state}, tmp_path / "r.th")
    loaded = load_checkpoint(tmp_path / "r.th")
    x = torch.rand(2, 3, 32, 32)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    torch.testing.assert_close(loaded(x), net.eval()((x - mean) / std))


def test_option_b_state_dict_without_normalisation_asks_for_it(tmp_path):
    torch.save(build("resnet26").state_dict(), tmp_path / "r.pt")
    with pytest.raises(ValueError, match="carries no input normalisation; pass mean"):
        load_checkpoint(tmp_path / "r.pt")
    assert load_checkpoint(tmp_path / "r.pt", mean=(0.5,) * 3, std=(0.2,) * 3).std.max() == 0.2


def test_real_mismatches_are_reported(tmp_path):
    state = build("resnet20").state_dict()
    del state["layer1.0.bn1.running_var"]
    state["extra.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"missing keys \['layer1.0.bn1.running_var'\]"):
        load_checkpoint(tmp_path / "bad.pt")
    state = build("resnet20").state_dict()
    state["layer1.0.conv1.weight"] = torch.zeros(16, 16, 5, 5)
    torch.save(state, tmp_path / "r20.pt")
    with pytest.raises(ValueError, match=r"shape mismatches \['layer1.0.conv1.weight: checkpoint"):
        load_checkpoint(tmp_path / "r20.pt", arch="resnet20")
    torch.save(build("resnet20").state_dict(), tmp_path / "r20.pt")
    with pytest.raises(ValueError, match=r"missing keys .*unexpected keys \['linear.bias'\]"):
        load_checkpoint(tmp_path / "r20.pt", arch="resnet26")


def test_unreadable_or_missing_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "none.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable torch checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="cannot infer the architecture"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(ValueError, match="unknown architecture 'vgg'"):
        load_checkpoint(tmp_path / "other.pt", arch="vgg")


@pytest.mark.parametrize("key, value, words", [
    ("module.layer1.0.bn1.running_var", float("nan"), "holds 1 NaN/Inf value"),
    ("module.bn1.running_var", float("inf"), "holds 1 NaN/Inf value"),
    ("module.layer2.1.conv1.weight", float("nan"), "holds 1 NaN/Inf value"),
    ("module.layer3.2.bn2.running_var", -0.5, "holds a negative variance (-0.5)"),
])
def test_damaged_checkpoints_are_rejected_at_load_naming_the_tensor(tmp_path, key, value, words):
    """Without the check these load, and DYN (any BN method) predicts NaN for every sample."""
    state = {f"module.{k}": v for k, v in build("resnet20").state_dict().items()}
    state[key].view(-1)[3] = value
    torch.save({"state_dict": state}, tmp_path / "r.th")
    with pytest.raises(ValueError, match=re.escape(f"r.th: tensor '{key}' {words}")):
        load_checkpoint(tmp_path / "r.th")
    state[key].view(-1)[3] = 0.0 if key.endswith("running_var") else 1.0  # zero variance is fine
    torch.save({"state_dict": state}, tmp_path / "r.th")
    assert torch.isfinite(dyntta.adapt(load_checkpoint(tmp_path / "r.th"))(torch.rand(4, 3, 32, 32))).all()


def test_read_failures_say_why_in_one_line(tmp_path):
    """torch.load's own reasons are empty (empty file), a bare number (a text file: '101'), or
    a page of advice; the error says what the file is instead."""
    torch.save({"state_dict": build("resnet20").state_dict()}, tmp_path / "good.pt")
    torch.save(build("resnet20").state_dict(), tmp_path / "legacy.th",
               _use_new_zipfile_serialization=False)  # pytorch_resnet_cifar10's format
    whole = tmp_path / "whole.pt"
    torch.save(build("resnet20"), whole)
    cases = {
        b"": "the file is empty",
        b"hello world\n": "not a file written by torch.save (neither a zip archive nor a pickle)",
        (tmp_path / "good.pt").read_bytes()[:300]: "damaged or truncated torch file (RuntimeError",
        (tmp_path / "legacy.th").read_bytes()[:5000]: "the file ends early (truncated?)",
        (tmp_path / "legacy.th").read_bytes()[:-10]: "damaged or truncated torch file (RuntimeError: unexpected EOF",
        whole.read_bytes(): "it pickles a Python object (dyntta.models.resnet.ResNet), e.g. a whole model",
    }
    for data, words in cases.items():
        (tmp_path / "bad.pt").write_bytes(data)
        with pytest.raises(ValueError) as info:
            load_checkpoint(tmp_path / "bad.pt")
        message = str(info.value)
        assert message.startswith(f"{tmp_path / 'bad.pt'} is not a readable torch checkpoint: ")
        assert words in message and "\n" not in message


def test_normalized_rejects_bad_statistics_and_channel_counts():
    with pytest.raises(ValueError, match="std must be positive"):
        Normalized(build("resnet20"), (0.5,) * 3, (0.2, 0.0, 0.2))
    with pytest.raises(ValueError, match=r"expected images \(B, 3, H, W\)"):
        Normalized(build("resnet20"), (0.5,) * 3, (0.2,) * 3)(torch.rand(1, 1, 8, 8))


def test_real_resnet20_checkpoint_scores_as_published(shared_data):
    """The data README: about 81% on the JPEG round-tripped CIFAR-10 test set."""
    model = load_checkpoint(shared_data / "resnet20-cifar10.th")
    assert infer_spec({k.removeprefix("net."): v for k, v in model.state_dict().items()}) == \
        ARCHITECTURES["resnet20"]
    data = np.load(shared_data / "cifar10-test-jpeg.npz")
    idx = np.random.default_rng(0).choice(10_000, 1000, replace=False)
    x = torch.from_numpy(data["x"][idx]).permute(0, 3, 1, 2).float() / 255
    y = torch.from_numpy(data["y"][idx])
    with torch.no_grad():
        acc = (dyntta.adapt(model, "source")(x).argmax(1) == y).float().mean().item()
    assert 0.76 < acc < 0.86


def test_a_mean_without_a_std_is_refused_not_ignored(tmp_path):
    from dyntta.models import load_checkpoint, save_checkpoint
    from tests.conftest import tiny_resnet

    save_checkpoint(tiny_resnet(), tmp_path / "m.pt")
    with pytest.raises(ValueError, match="give both mean and std .* not only mean"):
        load_checkpoint(tmp_path / "m.pt", mean=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="not only std"):
        load_checkpoint(tmp_path / "m.pt", std=[0.1, 0.2, 0.3])
    model = load_checkpoint(tmp_path / "m.pt", mean=[0.1, 0.2, 0.3], std=[1.0, 1.0, 1.0])
    assert model.mean.flatten().tolist() == pytest.approx([0.1, 0.2, 0.3])


def test_a_normalisation_of_the_wrong_length_names_the_channels():
    from dyntta.models import Normalized
    from tests.conftest import tiny_resnet

    with pytest.raises(ValueError, match="1 value.* but the network takes 3 input channels"):
        Normalized(tiny_resnet().net, [0.5], [0.25])
    with pytest.raises(ValueError, match="mean must be a list of numbers"):
        Normalized(tiny_resnet().net, "0.5", [0.25])
