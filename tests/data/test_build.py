"""build_corrupted: content, layout, caching, resuming after an interruption, refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dyntta.data import CORRUPTIONS, build, build_corrupted, corrupt, load_corrupted

RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 256, (7, 32, 32, 3), dtype=np.uint8)
LABELS = np.array([0, 1, 2, 0, 1, 2, 0])
NAMES = ["contrast", "gaussian_noise"]


def expected_block(name: str, severity: int, seed: int = 0, chunk_size: int = 3) -> np.ndarray:
    """The documented contract: chunk k corrupted with SeedSequence([seed, index, severity, k])."""
    chunks = [
        corrupt(IMAGES[start : start + chunk_size], name, severity,
                np.random.SeedSequence([seed, CORRUPTIONS.index(name), severity, k]))
        for k, start in enumerate(range(0, len(IMAGES), chunk_size))
    ]
    return np.concatenate(chunks)


def test_writes_the_cifar_c_layout_that_the_loader_reads(tmp_path):
    dataset = build_corrupted(IMAGES, LABELS, tmp_path / "set", NAMES, (2, 4), seed=0,
                              progress=False, chunk_size=3)
    assert dataset.corruptions == tuple(sorted(NAMES)) and dataset.severities == (2, 4)
    assert np.array_equal(np.load(tmp_path / "set" / "labels.npy"), np.tile(LABELS, 2))
    assert np.load(tmp_path / "set" / "gaussian_noise.npy").shape == (14, 32, 32, 3)
    reloaded = load_corrupted(tmp_path, "set")
    for name in NAMES:
        for severity in (2, 4):
            assert np.array_equal(reloaded.images(name, severity), expected_block(name, severity))
    assert np.array_equal(reloaded.labels, LABELS)
    assert not (tmp_path / "set" / ".parts").exists()
    assert json.loads((tmp_path / "set" / "meta.json").read_text())["severities"] == [2, 4]


def test_second_call_is_served_from_the_cache(tmp_path, monkeypatch):
    build_corrupted(IMAGES, LABELS, tmp_path, NAMES, (1,), progress=False, chunk_size=3)
    calls = []
    monkeypatch.setattr(build, "corrupt", lambda *a, **k: calls.append(a) or corrupt(*a, **k))
    build_corrupted(IMAGES, LABELS, tmp_path, NAMES, (1,), progress=False, chunk_size=3)
    assert calls == []
    build_corrupted(IMAGES, LABELS, tmp_path, NAMES + ["fog"], (1,), progress=False, chunk_size=3)
    assert {a[1] for a in calls} == {"fog"}  # only the corruption not built yet


def test_an_interrupted_build_leaves_whole_files_and_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    reference = build_corrupted(IMAGES, LABELS, tmp_path / "ref", NAMES, (1, 3), progress=False, chunk_size=3)

    calls = []

    def failing(*args, **kwargs):
        if len(calls) == 8:  # contrast done (2 severities x 3 chunks), 2 chunks of gaussian_noise
            raise KeyboardInterrupt
        calls.append(args[1:3])
        return corrupt(*args, **kwargs)

    out = tmp_path / "run"
    monkeypatch.setattr(build, "corrupt", failing)
    with pytest.raises(KeyboardInterrupt):
        build_corrupted(IMAGES, LABELS, out, NAMES, (1, 3), progress=False, chunk_size=3)
    assert (out / "contrast.npy").is_file() and not (out / "gaussian_noise.npy").exists()
    assert not list(out.rglob("*.tmp"))
    assert len(list((out / ".parts" / "gaussian_noise").glob("*.npy"))) == 2

    calls.clear()
    monkeypatch.setattr(build, "corrupt", lambda *a, **k: calls.append(a[1:3]) or corrupt(*a, **k))
    resumed = build_corrupted(IMAGES, LABELS, out, NAMES, (1, 3), progress=False, chunk_size=3)
    assert len(calls) == 4  # the 6 chunks of gaussian_noise minus the 2 kept
    for name in NAMES:
        for severity in (1, 3):
            assert np.array_equal(resumed.images(name, severity), reference.images(name, severity))


def test_a_build_with_other_settings_is_refused(tmp_path):
    build_corrupted(IMAGES, LABELS, tmp_path, ["fog"], (1,), seed=0, progress=False)
    with pytest.raises(ValueError, match="seed"):
        build_corrupted(IMAGES, LABELS, tmp_path, ["fog"], (1,), seed=1, progress=False)
    with pytest.raises(ValueError, match="fingerprint"):
        build_corrupted(IMAGES[::-1].copy(), LABELS, tmp_path, ["fog"], (1,), progress=False)


def test_a_foreign_folder_is_not_written_into(tmp_path):
    np.save(tmp_path / "fog.npy", np.zeros(3))
    with pytest.raises(ValueError, match="meta.json"):
        build_corrupted(IMAGES, LABELS, tmp_path, ["fog"], (1,), progress=False)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"labels": LABELS[:-1]}, "labels"),
        ({"labels": LABELS - 1}, "labels must be >= 0"),
        ({"images": IMAGES.astype(np.float32)}, "uint8"),
        ({"corruptions": ["rain"]}, "corruptions"),
        ({"corruptions": "fog"}, "corruptions"),
        ({"severities": (0,)}, "severities"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"recipe": "tiny"}, "recipe"),
        ({"frost_textures": "photo"}, "frost"),
    ],
)
def test_bad_arguments_raise(tmp_path, kwargs, match):
    args = {"images": IMAGES, "labels": LABELS, "out_dir": tmp_path, "corruptions": ["fog"],
            "severities": (1,), "progress": False, **kwargs}
    with pytest.raises(ValueError, match=match):
        build_corrupted(**args)
    assert not list(tmp_path.iterdir())


def test_a_killed_builds_leftovers_are_removed_by_the_next_build(tmp_path):
    """SIGKILL leaves what no ``finally`` removes: a half-assembled ``.<name>.npy.<rnd>.tmp``,
    the parts of a corruption assembled just before the kill, the parts of one not asked for
    now. The next build removes them and keeps only what it still needs."""
    out = tmp_path / "set"
    build_corrupted(IMAGES, LABELS, out, ["contrast"], (1,), progress=False, chunk_size=3)
    (out / ".contrast.npy.x1y2.tmp").write_bytes(b"half an array")
    stale = out / ".parts" / "contrast"  # assembled: contrast.npy is whole
    other = out / ".parts" / "fog"  # a corruption the next build does not ask for
    keep = out / ".parts" / "gaussian_noise"
    for folder in (stale, other, keep):
        folder.mkdir(parents=True)
        (folder / ".s1-c0.npy.abc.tmp").write_bytes(b"x")
    part = corrupt(IMAGES[:3], "gaussian_noise", 1,
                   np.random.SeedSequence([0, CORRUPTIONS.index("gaussian_noise"), 1, 0]))
    np.save(keep / "s1-c0.npy", part)
    build_corrupted(IMAGES, LABELS, out, NAMES, (1,), progress=False, chunk_size=3)
    assert sorted(p.name for p in out.iterdir()) == [
        ".lock", "contrast.npy", "gaussian_noise.npy", "labels.npy", "meta.json"]
    assert np.array_equal(load_corrupted(tmp_path, "set").images("gaussian_noise", 1),
                          expected_block("gaussian_noise", 1))


def test_a_warm_build_shows_no_progress_bar(tmp_path, capsys):
    build_corrupted(IMAGES, LABELS, tmp_path, ["contrast"], (1,), chunk_size=3)
    assert "make-c" in capsys.readouterr().err
    build_corrupted(IMAGES, LABELS, tmp_path, ["contrast"], (1,), chunk_size=3)
    assert capsys.readouterr().err == ""


def test_images_larger_than_the_recipes_frost_textures_take_frost(tmp_path):
    images = np.zeros((2, 64, 48, 3), np.uint8)  # the CIFAR recipe's textures crop under 63 rows
    built = build_corrupted(images, np.zeros(2, int), tmp_path / "c", recipe="cifar",
                            corruptions=["frost"], severities=[5], progress=False)
    frosted = np.asarray(built.images("frost", 5))
    assert frosted.shape == images.shape and (frosted != images).any()
