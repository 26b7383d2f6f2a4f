"""``benchmarks/refresh_statistics.py`` writes the model with its BN statistics re-estimated on
the chosen rows of an .npz's images, as a checkpoint that loads as the same architecture."""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.refresh_statistics import main
from dyntta.models import load_checkpoint, refresh_statistics, save_checkpoint
from tests.conftest import tiny_resnet


def test_the_command_writes_the_model_refreshed_on_the_rows_asked(tmp_path):
    images = np.random.default_rng(1).integers(0, 256, (10, 8, 8, 3), dtype=np.uint8)
    save_checkpoint(tiny_resnet(), tmp_path / "model.pt")
    np.savez(tmp_path / "clean.npz", x=images, y=np.zeros(10, dtype=np.int64))
    main([str(tmp_path / "model.pt"), str(tmp_path / "clean.npz"), "--rows", "even",
          "--out", str(tmp_path / "refreshed.pt")])
    written = load_checkpoint(tmp_path / "refreshed.pt")
    even = torch.from_numpy(images[0::2]).permute(0, 3, 1, 2).float() / 255
    expected = refresh_statistics(tiny_resnet(), even)
    for (name, a), b in zip(written.state_dict().items(), expected.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    x = torch.rand(2, 3, 8, 8)
    with torch.no_grad():
        assert not torch.allclose(written(x), tiny_resnet()(x))  # not the source model
