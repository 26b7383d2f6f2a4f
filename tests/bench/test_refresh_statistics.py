"""``benchmarks/refresh_statistics.py`` writes the model with its BN statistics re-estimated on
the chosen rows of an .npz's images, as a checkpoint that loads as the same architecture."""

from __future__ import annotations

import numpy as np
import pytest
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


def test_images_takes_the_seeds_random_draw_of_the_rows(tmp_path):
    images = np.random.default_rng(2).integers(0, 256, (12, 8, 8, 3), dtype=np.uint8)
    save_checkpoint(tiny_resnet(), tmp_path / "model.pt")
    np.savez(tmp_path / "clean.npz", x=images, y=np.zeros(12, dtype=np.int64))
    for seed in (0, 1):
        main([str(tmp_path / "model.pt"), str(tmp_path / "clean.npz"), "--rows", "odd",
              "--images", "4", "--seed", str(seed), "--out", str(tmp_path / f"{seed}.pt")])
    odd = torch.from_numpy(images[1::2]).permute(0, 3, 1, 2).float() / 255
    for seed in (0, 1):  # a direct reading: the first 4 of the seed's permutation of the 6 rows
        rows = torch.randperm(6, generator=torch.Generator().manual_seed(seed))[:4]
        expected = refresh_statistics(tiny_resnet(), odd[rows]).state_dict()
        written = load_checkpoint(tmp_path / f"{seed}.pt").state_dict()
        for name, value in expected.items():
            torch.testing.assert_close(written[name], value, msg=name)
    first, second = (load_checkpoint(tmp_path / f"{s}.pt").state_dict() for s in (0, 1))
    assert any(not torch.equal(first[k], second[k]) for k in first if "running_mean" in k)


def test_more_images_than_the_rows_hold_is_one_error_line(tmp_path, capsys):
    save_checkpoint(tiny_resnet(), tmp_path / "model.pt")
    np.savez(tmp_path / "clean.npz", x=np.zeros((5, 8, 8, 3), dtype=np.uint8),
             y=np.zeros(5, dtype=np.int64))
    with pytest.raises(SystemExit):
        main([str(tmp_path / "model.pt"), str(tmp_path / "clean.npz"), "--rows", "even",
              "--images", "4", "--out", str(tmp_path / "out.pt")])
    assert "--images 4: the even rows hold 3" in capsys.readouterr().err
    assert not (tmp_path / "out.pt").exists()
