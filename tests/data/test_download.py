"""``dyntta download`` against a local HTTP server on 127.0.0.1 serving small archives made here."""

from __future__ import annotations

import errno
import hashlib
import http.server
import io
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
from tqdm import tqdm

from dyntta.cli import main
from dyntta.data import load_corrupted
from dyntta.data import download as dl
from dyntta.data.download import DATASETS, Archive, Dataset, DiskFullError, download, download_file


class Server(http.server.ThreadingHTTPServer):
    """Serves ``files`` (name -> bytes); honours ``Range: bytes=N-`` unless ``ignore_range``;
    ``cut`` sends only that many body bytes of a full response, then closes."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.files: dict[str, bytes] = {}
        self.requests: list[str | None] = []
        self.ignore_range = False
        self.cut: int | None = None

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}?download=1"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        server: Server = self.server  # type: ignore[assignment]
        name = self.path.lstrip("/").split("?")[0]
        header = self.headers.get("Range")
        server.requests.append(header)
        if name not in server.files:
            self.send_error(404)
            return
        body, start = server.files[name], 0
        if header and not server.ignore_range:
            start = int(header.removeprefix("bytes=").rstrip("-"))
            if start >= len(body):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        payload = body[start:] if server.cut is None else body[start:start + server.cut]
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    srv = Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join()


def tar_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def cifar_like(seed: int = 0, n: int = 4) -> tuple[bytes, dict[str, np.ndarray]]:
    """A CIFAR-10-C-style tar: CIFAR-10-C/{fog,snow}.npy (5 n, 8, 8, 3) and labels.npy (5 n)."""
    rng = np.random.default_rng(seed)
    arrays = {c: rng.integers(0, 256, (5 * n, 8, 8, 3), dtype=np.uint8) for c in ("fog", "snow")}
    arrays["labels"] = np.tile(rng.integers(0, 10, n), 5)
    return tar_bytes({f"CIFAR-10-C/{k}.npy": npy(v) for k, v in arrays.items()}), arrays


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def cifar_dataset(server: Server, data: bytes, checksum: str | None = None) -> Dataset:
    server.files["CIFAR-10-C.tar"] = data
    archive = Archive(server.url("CIFAR-10-C.tar"), checksum or md5(data))
    return Dataset("CIFAR-10-C", "local", {"all": archive}, ("all",))


def test_download_verifies_extracts_into_the_loader_layout_and_cleans_up(server, tmp_path):
    data, arrays = cifar_like()
    folder = download(cifar_dataset(server, data), tmp_path, progress=False)
    assert folder == tmp_path / "CIFAR-10-C"
    dataset = load_corrupted(tmp_path, "CIFAR-10-C")
    assert set(dataset.corruptions) == {"fog", "snow"} and len(dataset) == 4
    np.testing.assert_array_equal(dataset.images("snow", 3), arrays["snow"][8:12])
    np.testing.assert_array_equal(dataset.labels, arrays["labels"][:4])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CIFAR-10-C"]  # no archive, no staging
    server.requests.clear()
    download(cifar_dataset(server, data), tmp_path, progress=False)  # present: nothing fetched
    assert server.requests == []


def test_the_progress_bar_counts_the_archive_bytes(server, tmp_path, capsys):
    data, _ = cifar_like()
    download(cifar_dataset(server, data), tmp_path, progress=True)
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    size = tqdm.format_sizeof(len(data))
    assert bar.startswith("CIFAR-10-C.tar: 100%") and f" {size}/{size} " in bar, bar


def test_truncated_partial_download_resumes_with_a_range_request(server, tmp_path):
    data, _ = cifar_like(1)
    dataset = cifar_dataset(server, data)
    (tmp_path / "CIFAR-10-C.tar.part").write_bytes(data[:1000])
    download(dataset, tmp_path, keep_archives=True, progress=False)
    assert server.requests == ["bytes=1000-"]
    assert (tmp_path / "CIFAR-10-C.tar").read_bytes() == data
    assert not (tmp_path / "CIFAR-10-C.tar.part").exists()


def test_connection_cut_keeps_the_partial_and_a_rerun_finishes(server, tmp_path):
    data, _ = cifar_like(2)
    dataset = cifar_dataset(server, data)
    server.cut = 3000
    with pytest.raises(ConnectionError, match=r"CIFAR-10-C.tar .*3,000 .*run again to resume"):
        download(dataset, tmp_path, progress=False)
    assert (tmp_path / "CIFAR-10-C.tar.part").stat().st_size == 3000
    assert not (tmp_path / "CIFAR-10-C").exists()
    server.cut = None
    download(dataset, tmp_path, progress=False)
    assert server.requests[-1] == "bytes=3000-"
    assert len(load_corrupted(tmp_path, "CIFAR-10-C")) == 4


def test_server_ignoring_the_range_restarts_from_zero(server, tmp_path):
    data, _ = cifar_like(3)
    server.files["x.tar"] = data
    server.ignore_range = True
    (tmp_path / "x.tar.part").write_bytes(b"garbage that is not the start")
    download_file(server.url("x.tar"), tmp_path / "x.tar", md5(data), progress=False)
    assert (tmp_path / "x.tar").read_bytes() == data


def test_complete_partial_is_answered_416_and_then_verified(server, tmp_path):
    data, _ = cifar_like(4)
    server.files["x.tar"] = data
    (tmp_path / "x.tar.part").write_bytes(data)
    download_file(server.url("x.tar"), tmp_path / "x.tar", md5(data), progress=False)
    assert (tmp_path / "x.tar").read_bytes() == data


def test_checksum_mismatch_is_a_clear_error_and_removes_the_download(server, tmp_path):
    data, _ = cifar_like()
    dataset = cifar_dataset(server, data, checksum="0" * 32)
    with pytest.raises(ValueError, match=f"checksum mismatch for CIFAR-10-C.tar .*MD5 {md5(data)}, "
                                         f"expected 0{{32}}"):
        download(dataset, tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_missing_file_and_unreachable_server_are_connection_errors(server, tmp_path):
    with pytest.raises(ConnectionError, match="HTTP 404"):
        download_file(server.url("none.tar"), tmp_path / "none.tar", "0" * 32, progress=False)
    with pytest.raises(ConnectionError, match="cannot download http://127.0.0.1:9/"):
        download_file("http://127.0.0.1:9/x.tar", tmp_path / "x.tar", "0" * 32, progress=False)


class FullDisk(io.BytesIO):
    """A file that accepts ``room`` bytes, then fails like a full disk."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, data) -> int:
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def test_disk_full_while_writing_is_a_clear_error(server, tmp_path, monkeypatch):
    data, _ = cifar_like()
    server.files["x.tar"] = data
    monkeypatch.setattr(dl, "CHUNK", 1024)
    monkeypatch.setattr(dl, "_open_partial", lambda path, append: FullDisk(2048))
    with pytest.raises(DiskFullError, match=r"disk full while writing .*x.tar.part.*run again"):
        download_file(server.url("x.tar"), tmp_path / "x.tar", md5(data), progress=False)


def test_not_enough_free_space_is_refused_up_front(server, tmp_path, monkeypatch):
    data, _ = cifar_like()
    server.files["x.tar"] = data
    monkeypatch.setattr(dl.shutil, "disk_usage", lambda path: type("U", (), {"free": 10})())
    with pytest.raises(DiskFullError, match=f"not enough free space for x.tar .*{len(data):,} bytes"):
        download_file(server.url("x.tar"), tmp_path / "x.tar", md5(data), progress=False)
    assert not (tmp_path / "x.tar.part").exists()


def test_disk_full_while_extracting_leaves_nothing_half_written(server, tmp_path, monkeypatch):
    data, _ = cifar_like()
    dataset = cifar_dataset(server, data)

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tarfile.TarFile, "extractall", no_space)
    with pytest.raises(DiskFullError, match="disk full while extracting"):
        download(dataset, tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CIFAR-10-C.tar"]  # verified, kept


def jpeg_bytes(seed: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    array = np.random.default_rng(seed).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    Image.fromarray(array).save(buffer, format="JPEG")
    return buffer.getvalue()


def imagenet_like_dataset(server: Server) -> Dataset:
    """Two ImageNet-C-style parts: ``noise.tar`` with top-level corruption folders and
    ``blur.tar`` with them one level down (``blur/<corruption>``)."""
    parts = {}
    for part, corruptions, prefix in (("noise", ("gaussian_noise", "shot_noise"), ""),
                                      ("blur", ("defocus_blur",), "blur/")):
        files = {f"{prefix}{c}/{s}/{wnid}/{i}.JPEG": jpeg_bytes(i)
                 for c in corruptions for s in (1, 5) for wnid in ("n01", "n02") for i in range(2)}
        data = tar_bytes(files)
        server.files[f"{part}.tar"] = data
        parts[part] = Archive(server.url(f"{part}.tar"), md5(data), corruptions)
    return Dataset("ImageNet-C", "local", parts, ("noise",))


def test_imagenet_parts_land_in_one_folder_per_corruption(server, tmp_path):
    dataset = imagenet_like_dataset(server)
    download(dataset, tmp_path, progress=False)
    assert sorted(p.name for p in (tmp_path / "ImageNet-C").iterdir()) == ["gaussian_noise", "shot_noise"]
    download(dataset, tmp_path, parts=["noise", "blur"], progress=False)
    loaded = load_corrupted(tmp_path, "ImageNet-C")
    assert set(loaded.corruptions) == {"gaussian_noise", "shot_noise", "defocus_blur"}
    assert loaded.severities == (1, 5) and len(loaded) == 4 and loaded.num_classes == 2
    assert loaded.images("defocus_blur", 5).shape == (4, 6, 6, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ImageNet-C"]


def test_unsafe_archive_members_are_refused(server, tmp_path):
    data = tar_bytes({"../evil/labels.npy": b"x"})
    with pytest.raises(ValueError, match="unsafe archive member '../evil/labels.npy'"):
        download(cifar_dataset(server, data), tmp_path / "root", progress=False)
    assert not (tmp_path / "evil").exists()


def test_bad_names_and_partial_folders_are_errors(server, tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'mnist-c'; available: cifar10-c"):
        download("mnist-c", tmp_path)
    with pytest.raises(ValueError, match=r"unknown parts \['snowy'\]; available: noise, blur"):
        download("imagenet-c", tmp_path, parts=["snowy"])
    dataset = imagenet_like_dataset(server)
    (tmp_path / "ImageNet-C" / "gaussian_noise").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"already holds \['gaussian_noise'\] of archive noise.tar"):
        download(dataset, tmp_path, progress=False)


def test_published_records_are_complete():
    """Zenodo records 2535967, 3555552, 2235448: one tar per CIFAR set, five ImageNet-C groups
    whose four default ones hold the 15 benchmark corruptions."""
    from dyntta.data import CORRUPTIONS

    assert DATASETS["cifar10-c"].parts["all"].filename == "CIFAR-10-C.tar"
    assert DATASETS["cifar100-c"].parts["all"].url.startswith("https://zenodo.org/records/3555552/")
    imagenet = DATASETS["imagenet-c"]
    default = [c for p in imagenet.default_parts for c in imagenet.parts[p].corruptions]
    assert sorted(default) == sorted(CORRUPTIONS)
    assert len(imagenet.parts["extra"].corruptions) == 4
    for dataset in DATASETS.values():
        for archive in dataset.parts.values():
            assert len(archive.md5) == 32 and int(archive.md5, 16) >= 0


def test_cli_reports_a_checksum_mismatch_in_one_line(server, tmp_path, monkeypatch, capsys):
    data, _ = cifar_like()
    monkeypatch.setitem(DATASETS, "cifar10-c", cifar_dataset(server, data, checksum="f" * 32))
    assert main(["download", "cifar10-c", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dyntta download: error: checksum mismatch for CIFAR-10-C.tar")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    monkeypatch.setitem(DATASETS, "cifar10-c", cifar_dataset(server, data))
    server.cut = 100
    assert main(["download", "cifar10-c", str(tmp_path), "--no-progress"]) == 2
    assert "run again to resume" in capsys.readouterr().err
    server.cut = None
    assert main(["download", "cifar10-c", str(tmp_path), "--no-progress"]) == 0
    assert Path(capsys.readouterr().out.split(":")[0]) == tmp_path / "CIFAR-10-C"
