"""``benchmarks/refresh_statistics.py``: every BN layer's running statistics become the average
of the batches' own over the given clean images, and nothing else in the model changes; the
command writes a checkpoint that loads as the same architecture."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from benchmarks.refresh_statistics import main, refresh
from dyntta.models.checkpoint import load_checkpoint, save_checkpoint
from tests.conftest import tiny_resnet


def uint8_images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)


def test_the_first_layer_holds_the_average_of_its_batches_statistics():
    model, images = tiny_resnet(), uint8_images(12)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    first = next(m for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    inputs = []  # the first BN's inputs do not depend on any BN statistics
    hook = first.register_forward_pre_hook(lambda m, args: inputs.append(args[0].clone()))
    with torch.no_grad():
        for start in (0, 4, 8):
            model(torch.from_numpy(images[start : start + 4]).permute(0, 3, 1, 2).float() / 255)
    hook.remove()
    momentum = first.momentum
    refresh(model, images, batch_size=4)
    means = torch.stack([x.mean((0, 2, 3)) for x in inputs]).mean(0)
    variances = torch.stack([x.var((0, 2, 3), unbiased=True) for x in inputs]).mean(0)
    torch.testing.assert_close(first.running_mean, means)
    torch.testing.assert_close(first.running_var, variances)
    assert first.momentum == momentum and not model.training
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.endswith(("running_mean", "running_var", "num_batches_tracked"))
                           for k in changed)


def test_the_command_writes_the_refreshed_model(tmp_path):
    model, images = tiny_resnet(), uint8_images(10, seed=1)
    save_checkpoint(model, tmp_path / "model.pt")
    np.savez(tmp_path / "clean.npz", x=images, y=np.zeros(10, dtype=np.int64))
    main([str(tmp_path / "model.pt"), str(tmp_path / "clean.npz"), "--rows", "even",
          "--out", str(tmp_path / "refreshed.pt")])
    written = load_checkpoint(tmp_path / "refreshed.pt")
    expected = refresh(tiny_resnet(), images[0::2])
    for (name, a), b in zip(written.state_dict().items(), expected.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    x = torch.rand(2, 3, 8, 8)
    with torch.no_grad():
        assert not torch.allclose(written(x), tiny_resnet()(x))  # not the source model
