"""Download the published corrupted test sets (CIFAR-10-C, CIFAR-100-C, ImageNet-C) from Zenodo.

Every archive is fetched into ``<root>/<file>.part`` (an interrupted download resumes from there
with an HTTP Range request), checked against its published MD5, renamed to ``<root>/<file>``,
then extracted into a hidden folder beside the target and renamed into the layout
:func:`dyntta.data.load_corrupted` reads: ``<root>/CIFAR-10-C/<corruption>.npy`` and
``<root>/ImageNet-C/<corruption>/<severity>/<wnid>/<file>.JPEG``. A set (or, for ImageNet-C, a
corruption folder) appears only when complete, and a re-run skips what is there.

Sources (Hendrycks & Dietterich, ICLR 2019; files and MD5 checksums as listed on the Zenodo
records, the same values that pytorch-ood and TorchUncertainty check):

- CIFAR-10-C: https://zenodo.org/records/2535967, ``CIFAR-10-C.tar``.
- CIFAR-100-C: https://zenodo.org/records/3555552, ``CIFAR-100-C.tar``.
- ImageNet-C: https://zenodo.org/records/2235448, one archive per corruption group: ``noise.tar``,
  ``blur.tar``, ``weather.tar``, ``digital.tar`` (the 15 benchmark corruptions) and ``extra.tar``
  (the 4 held-out ones).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import http.client
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO, Iterable, Sequence

from tqdm import tqdm

CHUNK = 1 << 20
TIMEOUT_S = 60


@dataclasses.dataclass(frozen=True)
class Archive:
    """One published file: its URL, MD5 and, for ImageNet-C, the corruption folders it holds."""

    url: str
    md5: str
    corruptions: tuple[str, ...] = ()

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1].split("?", 1)[0]


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A downloadable set: the folder name the loaders read, its record and archives by part."""

    folder: str
    record: str
    parts: dict[str, Archive]
    default_parts: tuple[str, ...]


def _zenodo(record: int, name: str) -> str:
    return f"https://zenodo.org/records/{record}/files/{name}?download=1"


DATASETS: dict[str, Dataset] = {
    "cifar10-c": Dataset(
        "CIFAR-10-C", "https://zenodo.org/records/2535967",
        {"all": Archive(_zenodo(2535967, "CIFAR-10-C.tar"), "56bf5dcef84df0e2308c6dcbcbbd8499")},
        ("all",),
    ),
    "cifar100-c": Dataset(
        "CIFAR-100-C", "https://zenodo.org/records/3555552",
        {"all": Archive(_zenodo(3555552, "CIFAR-100-C.tar"), "11f0ed0f1191edbf9fa23466ae6021d3")},
        ("all",),
    ),
    "imagenet-c": Dataset(
        "ImageNet-C", "https://zenodo.org/records/2235448",
        {
            "noise": Archive(_zenodo(2235448, "noise.tar"), "e80562d7f6c3f8834afb1ecf27252745",
                             ("gaussian_noise", "shot_noise", "impulse_noise")),
            "blur": Archive(_zenodo(2235448, "blur.tar"), "2d8e81fdd8e07fef67b9334fa635e45c",
                            ("defocus_blur", "glass_blur", "motion_blur", "zoom_blur")),
            "weather": Archive(_zenodo(2235448, "weather.tar"), "33ffea4db4d93fe4a428c40a6ce0c25d",
                               ("snow", "frost", "fog", "brightness")),
            "digital": Archive(_zenodo(2235448, "digital.tar"), "89157860d7b10d5797849337ca2e5c03",
                               ("contrast", "elastic_transform", "pixelate", "jpeg_compression")),
            "extra": Archive(_zenodo(2235448, "extra.tar"), "d492dfba5fc162d8ec2c3cd8ee672984",
                             ("speckle_noise", "spatter", "gaussian_blur", "saturate")),
        },
        ("noise", "blur", "weather", "digital"),
    ),
}


class DiskFullError(OSError):
    """No space left on the device while downloading or extracting."""


def md5sum(path: str | os.PathLike) -> str:
    """Hex MD5 of a file, read in 1 MiB chunks."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _open_partial(path: Path, append: bool) -> BinaryIO:
    return open(path, "ab" if append else "wb")


def _disk_full(what: str, path: Path, exc: OSError) -> DiskFullError:
    return DiskFullError(
        errno.ENOSPC, f"disk full while {what} {path} (free space left: "
        f"{shutil.disk_usage(path.parent).free:,} bytes); free some space and run again "
        f"(a partial download resumes): {exc.strerror}"
    )


def download_file(url: str, dest: str | os.PathLike, md5: str, progress: bool = True) -> Path:
    """Fetch ``url`` to ``dest`` via ``dest.part``, resuming a partial download, and check its MD5.

    Raises:
        ValueError: the MD5 differs (the download is removed, so a re-run starts afresh).
        DiskFullError: not enough free space (checked up front when the size is known) or the
            disk filled up (the partial download is kept for resuming).
        ConnectionError: the server cannot be reached or the connection broke (partial kept).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".part")
    offset = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code != 416 or not offset:  # 416: nothing left after offset, the .part is whole
            raise ConnectionError(f"cannot download {url}: HTTP {exc.code} {exc.reason}") from exc
        response = None
    except (urllib.error.URLError, OSError) as exc:
        raise ConnectionError(f"cannot download {url}: {getattr(exc, 'reason', exc)}") from exc
    if response is not None:
        with response:
            _receive(response, partial, offset, dest.name, progress)
    actual = md5sum(partial)
    if actual != md5:
        partial.unlink()
        raise ValueError(
            f"checksum mismatch for {dest.name} from {url}: MD5 {actual}, expected {md5} "
            "(the published value); the download was removed, run again to fetch it afresh"
        )
    os.replace(partial, dest)
    return dest


def _receive(response, partial: Path, offset: int, name: str, progress: bool) -> None:
    """Write the body of ``response`` to ``partial``, appending if the server honoured the range."""
    resumed = response.status == 206
    if offset and resumed and not response.headers.get("Content-Range", "").startswith(
        f"bytes {offset}-"
    ):
        raise ConnectionError(
            f"server answered the resume of {name} from byte {offset} with "
            f"Content-Range {response.headers.get('Content-Range')!r}"
        )
    start = offset if resumed else 0
    length = response.headers.get("Content-Length")
    total = start + int(length) if length is not None else None
    if total is not None and total - start > shutil.disk_usage(partial.parent).free:
        raise DiskFullError(
            errno.ENOSPC, f"not enough free space for {name} in {partial.parent}: "
            f"{total - start:,} bytes to fetch, {shutil.disk_usage(partial.parent).free:,} free"
        )
    received = start
    try:
        with tqdm(total=total, initial=start, unit="B", unit_scale=True, desc=name,
                  disable=not progress) as bar, _open_partial(partial, resumed) as out:
            for chunk in iter(lambda: response.read(CHUNK), b""):
                out.write(chunk)
                received += len(chunk)
                bar.update(len(chunk))
    except (OSError, http.client.HTTPException) as exc:
        if getattr(exc, "errno", None) == errno.ENOSPC:
            raise _disk_full("writing", partial, exc) from exc
        raise ConnectionError(
            f"download of {name} broke after {received:,} bytes ({exc!r}); run again to resume"
        ) from exc
    if total is not None and received < total:
        raise ConnectionError(
            f"download of {name} ended after {received:,} of {total:,} bytes; run again to resume"
        )


def _check_members(tar: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    """The members of ``tar``; anything but plain files and folders inside the target is an error."""
    members = tar.getmembers()
    for m in members:
        parts = Path(m.name).parts
        if not (m.isfile() or m.isdir()) or Path(m.name).is_absolute() or ".." in parts:
            raise ValueError(f"{archive}: unsafe archive member {m.name!r} (link, device or outside path)")
    return members


def extract(archive: str | os.PathLike, root: str | os.PathLike, dataset: Dataset,
            corruptions: Sequence[str] = ()) -> list[Path]:
    """Extract ``archive`` beside ``<root>/<dataset.folder>`` and rename its contents into place.

    ``corruptions`` empty: the archive holds one folder with ``labels.npy`` (CIFAR layout),
    renamed to ``<root>/<folder>``. Otherwise it holds these corruption folders (each with
    severity sub-folders), renamed to ``<root>/<folder>/<corruption>``. Returns the new folders.
    """
    archive, root = Path(archive), Path(root)
    staging = root / f".{dataset.folder}.{archive.name}.extracting"
    shutil.rmtree(staging, ignore_errors=True)  # left over from an interrupted run
    staging.mkdir(parents=True)
    try:
        with tarfile.open(archive) as tar:
            options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(staging, members=_check_members(tar, archive), **options)
        found = _payload(staging, archive, corruptions)
        targets = [root / dataset.folder] if not corruptions else \
            [root / dataset.folder / c for c in corruptions]
        targets[0].parent.mkdir(parents=True, exist_ok=True)
        for source, target in zip(found, targets):
            os.replace(source, target)
        return targets
    except tarfile.TarError as exc:
        raise ValueError(f"{archive} is not a readable tar archive: {exc}") from exc
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _disk_full("extracting", archive, exc) from exc
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _payload(staging: Path, archive: Path, corruptions: Sequence[str]) -> list[Path]:
    """The extracted folders to move: the one holding ``labels.npy``, or the corruption folders
    (at the top or one level down, e.g. ``defocus_blur`` or ``blur/defocus_blur``)."""
    children = [p for p in sorted(staging.iterdir()) if p.is_dir()]
    folders = [staging, *children, *(q for p in children for q in sorted(p.iterdir()) if q.is_dir())]
    if not corruptions:
        found = [p for p in folders if (p / "labels.npy").is_file()]
        if len(found) != 1:
            raise ValueError(f"{archive}: expected one folder holding labels.npy, found {len(found)}")
        return found
    by_name = {p.name: p for p in folders if (p / "1").is_dir() or (p / "5").is_dir()}
    missing = [c for c in corruptions if c not in by_name]
    if missing:
        raise ValueError(f"{archive}: no <corruption>/<severity>/ folders for {missing}")
    return [by_name[c] for c in corruptions]


def download(
    name: str | Dataset,
    root: str | os.PathLike,
    parts: Iterable[str] | None = None,
    keep_archives: bool = False,
    progress: bool = True,
) -> Path:
    """Download and extract a published corrupted set into ``<root>/<folder>``; returns that folder.

    Args:
        name: a key of :data:`DATASETS` (``cifar10-c``, ``cifar100-c``, ``imagenet-c``) or a
            :class:`Dataset`.
        root: the data root (``load_corrupted(root, folder)`` opens the result).
        parts: ImageNet-C archives to fetch (default ``noise blur weather digital``, the 15
            benchmark corruptions; add ``extra`` for the 4 held-out ones).
        keep_archives: keep the verified ``.tar`` files after extraction (default: remove them).
        progress: show progress bars.
    """
    dataset = name if isinstance(name, Dataset) else DATASETS.get(name)
    if dataset is None:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(DATASETS)}")
    chosen = list(dataset.default_parts if parts is None else parts)
    unknown = [p for p in chosen if p not in dataset.parts]
    if unknown or not chosen:
        raise ValueError(
            f"{dataset.folder}: unknown parts {unknown or chosen}; available: {', '.join(dataset.parts)}"
        )
    root = Path(root).expanduser()
    target = root / dataset.folder
    for folder in (root, target):
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{folder} is a file, not a folder: give a data root folder to "
                             "download into")
    for part in chosen:
        archive = dataset.parts[part]
        wanted = [target / c for c in archive.corruptions] or [target]
        if all(p.is_dir() for p in wanted):
            continue
        if any(p.is_dir() for p in wanted):
            present = [p.name for p in wanted if p.is_dir()]
            raise ValueError(
                f"{target} already holds {present} of archive {archive.filename}; remove them to "
                "download it again"
            )
        local = root / archive.filename
        if local.is_file():
            if md5sum(local) != archive.md5:
                raise ValueError(
                    f"{local} exists but its MD5 is not the published {archive.md5}; remove it "
                    "and run again"
                )
        else:
            download_file(archive.url, local, archive.md5, progress)
        extract(local, root, dataset, archive.corruptions)
        if not keep_archives:
            local.unlink()
    return target
