"""``attncnn.download`` / ``attncnn download``: a model fetched on request from a folder or an http(s)
server into the user cache, each file checked against the manifest's size and sha256, and moved into
place only when all of them match; :func:`attncnn.pretrained` then finds it by name."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import http.server
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

import attncnn
from attncnn._cache_dir import user_cache_dir
from attncnn.api import PACKAGED_MODELS, DownloadError, downloadable, pretrained_path
from attncnn.api import downloads
from attncnn.api.downloads import DOWNLOADS_MANIFEST, downloads_folder, read_manifest
from attncnn.cli import main
from attncnn.errors import InputError

RESULTS = Path(__file__).resolve().parents[2] / "results"
PACKAGED = PACKAGED_MODELS / "mini-long" / "quadratic-mini" / "seed0"
FILES = ("config.json", "finished.json", "machine.json", "checkpoints/last.safetensors")


def _files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty user cache, and no results folder (so only the cache and the package are looked in)."""
    monkeypatch.setenv("ATTNCNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNCNN_RESULTS", str(tmp_path / "no-results"))
    return tmp_path / "cache"


@pytest.fixture
def fake(tmp_path) -> tuple[Path, Path]:
    """A source folder laid out like results/ holding the packaged quadratic-mini as the large model
    ``paper-long/tiny/seed0``, and a manifest of it (name ``tiny``): ``(source, manifest)``."""
    source = tmp_path / "source"
    run = source / "paper-long" / "tiny" / "seed0"
    for rel in FILES:
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PACKAGED / rel, run / rel)
    files = {rel: {"bytes": (run / rel).stat().st_size, "sha256": hashlib.sha256((run / rel).read_bytes()).hexdigest()}
             for rel in FILES}
    manifest = tmp_path / "manifest.json"
    entry = {"path": "paper-long/tiny/seed0", "files": files}
    manifest.write_text(json.dumps({"format": 1, "models": {"tiny": entry}}))
    return source, manifest


class _Server:
    """http.server on 127.0.0.1 serving ``folder``, in a thread; ``cut`` names paths whose body is cut
    after half its bytes (the connection then closes); ``requests`` counts the GETs."""

    def __init__(self, folder: Path) -> None:
        self.cut: set[str] = set()
        self.requests = 0
        owner = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                owner.requests += 1
                if self.path.lstrip("/") in owner.cut:
                    body = (folder / self.path.lstrip("/")).read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[:len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                     functools.partial(Handler, directory=str(folder)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def server(fake):
    served = _Server(fake[0])
    yield served
    served.close()


def test_the_cache_folder_rule(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNCNN_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "attncnn"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "attncnn"
    monkeypatch.setenv("ATTNCNN_CACHE_DIR", str(tmp_path / "mine"))
    assert user_cache_dir() == tmp_path / "mine" and downloads_folder() == tmp_path / "mine" / "models"
    assert not (tmp_path / "mine").exists()                 # the rule creates nothing


@pytest.mark.slow
def test_over_http_the_files_are_checked_and_pretrained_finds_the_model(cache, fake, server):
    source, manifest = fake
    folder = attncnn.download("tiny", server.url + "/", manifest=manifest)
    assert folder == cache / "models" / "paper-long" / "tiny" / "seed0"
    assert [p.relative_to(folder).as_posix() for p in _files_in(folder)] == sorted(FILES)
    assert all((folder / rel).read_bytes() == (PACKAGED / rel).read_bytes() for rel in FILES)
    assert [p.name for p in (cache / "models").iterdir()] == ["paper-long"]        # no temporary folder left
    assert pretrained_path("tiny") == folder
    images = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(attncnn.pretrained("tiny")(images), attncnn.load_model(PACKAGED)(images))
    asked = server.requests
    assert attncnn.download("tiny", server.url, manifest=manifest) == folder and server.requests == asked
    # a damaged copy in the cache (a changed byte) is fetched again and replaced
    config = folder / "config.json"
    config.write_text(config.read_text().replace("60", "61"))
    attncnn.download("tiny", server.url, manifest=manifest)
    assert server.requests == asked + len(FILES) and config.read_bytes() == (PACKAGED / "config.json").read_bytes()


def test_a_wrong_file_is_refused_and_nothing_is_left(cache, fake, server):
    source, manifest = fake
    record = json.loads(manifest.read_text())
    record["models"]["tiny"]["files"]["checkpoints/last.safetensors"]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(record))
    with pytest.raises(DownloadError, match=r"sha256 [0-9a-f]{64} differs from the manifest's 0{64}"):
        attncnn.download("tiny", server.url, manifest=manifest)
    assert _files_in(cache) == []
    # a file of another size is refused before its hash is even needed
    record["models"]["tiny"]["files"]["config.json"]["bytes"] -= 1
    manifest.write_text(json.dumps(record))
    with pytest.raises(DownloadError, match="got more than"):
        attncnn.download("tiny", source, manifest=manifest)
    assert _files_in(cache) == []


def test_an_interrupted_transfer_leaves_nothing(cache, fake, server):
    source, manifest = fake
    server.cut.add("paper-long/tiny/seed0/checkpoints/last.safetensors")
    size = (PACKAGED / "checkpoints" / "last.safetensors").stat().st_size
    with pytest.raises(DownloadError, match=f"got {size // 2:,} bytes, the manifest records {size:,}"):
        attncnn.download("tiny", server.url, manifest=manifest)
    assert _files_in(cache) == []
    with pytest.raises(FileNotFoundError, match="no trained model 'tiny'"):
        pretrained_path("tiny")


def test_bad_names_and_sources_are_answered(cache, fake, server, tmp_path):
    source, manifest = fake
    with pytest.raises(ValueError, match=r"no downloadable model 'quadratc'; the names are learned, quadratic, "
                                         r"quadratic-generalized, resnet18 \(the 60-epoch mini models come"):
        attncnn.download("quadratc", source)
    with pytest.raises(DownloadError, match="HTTP 404"):
        attncnn.download("tiny", server.url + "/elsewhere", manifest=manifest)
    with pytest.raises(FileNotFoundError, match="no folder"):
        attncnn.download("tiny", tmp_path / "nowhere", manifest=manifest)
    with pytest.raises(ValueError, match="http:// or https://"):
        attncnn.download("tiny", "ftp://127.0.0.1/results", manifest=manifest)
    (source / "paper-long" / "tiny" / "seed0" / "machine.json").unlink()
    with pytest.raises(FileNotFoundError, match="laid out like a clone's results/"):
        attncnn.download("tiny", source, manifest=manifest)
    assert _files_in(cache) == []


def test_the_manifest_names_the_width_400_models_of_results():
    models = read_manifest()
    assert downloadable() == ["learned", "quadratic", "quadratic-generalized", "resnet18"]
    assert {name: entry["path"] for name, entry in models.items()} == {
        name: f"paper-long/{name}/seed0" for name in downloadable()}
    assert json.loads(DOWNLOADS_MANIFEST.read_text())["models"] == models


@pytest.mark.skipif(not (RESULTS / "paper-long" / "resnet18" / "seed0" / "checkpoints").is_dir(),
                    reason="no committed results/paper-long")
def test_the_command_copies_a_real_model_from_a_clones_results(cache, capsys):
    assert main(["download", "resnet18", "--from", str(RESULTS)]) == 0
    folder = cache / "models" / "paper-long" / "resnet18" / "seed0"
    assert f"resnet18: {folder}" in capsys.readouterr().out
    entry = read_manifest()["resnet18"]
    assert sorted(p.relative_to(folder).as_posix() for p in _files_in(folder)) == sorted(entry["files"])
    assert pretrained_path("resnet18") == folder
    model = attncnn.pretrained("resnet18")
    assert sum(p.numel() for p in model.network.parameters()) == 11_173_962          # PAPER.md 5.2
    assert main(["download", "resnet-18", "--from", str(RESULTS)]) == 2
    assert "error: no downloadable model 'resnet-18'; the names are learned, quadratic" in capsys.readouterr().err


class _Trickle(http.server.BaseHTTPRequestHandler):
    """Answers every GET with a Content-Length of 1,000 bytes and then one byte every 0.1 s, for at
    most 5 s (then it closes): each read gets its byte well within any timeout."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        end = time.monotonic() + 5
        while time.monotonic() < end:
            try:
                self.wfile.write(b"x")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.1)

    def log_message(self, *args):
        pass


def test_a_server_that_trickles_bytes_meets_the_downloads_deadline(cache, fake, monkeypatch):
    source, manifest = fake
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    # the default deadline, --timeout plus the model's size at MIN_RATE, made short for the test
    monkeypatch.setattr(downloads, "MIN_RATE", 10**9, raising=False)
    try:
        start = time.monotonic()
        with pytest.raises(DownloadError, match=r"did not finish within 1 s \(--timeout plus [\d,]+ bytes at .*\): "
                                                r".*config\.json stalled after \d+ bytes.*--deadline SECONDS"):
            attncnn.download("tiny", f"http://127.0.0.1:{httpd.server_address[1]}", manifest=manifest, timeout=1)
        assert time.monotonic() - start < 3
        with pytest.raises(DownloadError, match=r"did not finish within 1 s \(--deadline\)"):
            attncnn.download("tiny", f"http://127.0.0.1:{httpd.server_address[1]}", manifest=manifest, timeout=30,
                             deadline=1)
        assert time.monotonic() - start < 6
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert _files_in(cache) == []


def _writer_after(fifo: Path, seconds: float) -> None:
    """After ``seconds``, write into ``fifo`` if a reader has opened it (so that a download blocked on
    it ends); never blocks itself."""
    def write():
        end = time.monotonic() + seconds + 2
        time.sleep(seconds)
        while time.monotonic() < end:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:           # ENXIO: no reader
                time.sleep(0.05)
                continue
            os.write(fd, b"{}")
            os.close(fd)
            return
    threading.Thread(target=write, daemon=True).start()


@pytest.mark.parametrize("kind, said", [("fifo", "a FIFO"), ("folder", "a folder")])
def test_a_source_file_that_is_not_a_regular_file_is_blamed_on_the_source_without_blocking(cache, fake, kind, said):
    source, manifest = fake
    config = source / "paper-long" / "tiny" / "seed0" / "config.json"
    config.unlink()
    if kind == "fifo":
        os.mkfifo(config)
        _writer_after(config, 3)      # a download that waits on it would end with another error after 3 s
    else:
        config.mkdir()
    start = time.monotonic()
    with pytest.raises(DownloadError, match=f"{config} of the source is {said}, not the file it must be; the source "
                                            "must be a copy of a clone's results/ folder"):
        attncnn.download("tiny", source, manifest=manifest)
    assert time.monotonic() - start < 2
    assert _files_in(cache) == []


@pytest.mark.parametrize("value", ["-1", "nan", "0", "inf", "soon"])
def test_a_timeout_that_is_not_a_positive_number_is_one_line(cache, fake, capsys, value):
    source, _ = fake
    with pytest.raises(SystemExit) as stop:
        main(["download", "tiny", "--from", str(source), "--timeout", value])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"attncnn download: error: argument --timeout: '{value}'")
    assert "Traceback" not in "".join(err)
    with pytest.raises(InputError, match="timeout must be a positive number of seconds"):
        attncnn.download("tiny", source, timeout=float(value) if value != "soon" else value)


def test_two_downloads_of_one_model_into_one_cache_both_succeed(cache, fake, monkeypatch, caplog):
    # the second download finds, just before its rename, that the first has stored the model
    source, manifest = fake
    rename, other = os.rename, []

    def rename_after_another_download(src, dst):
        if Path(src).name.startswith(".download-") and not other:
            other.append(None)
            other[0] = attncnn.download("tiny", source, manifest=manifest)      # it completes first
        return rename(src, dst)

    monkeypatch.setattr(os, "rename", rename_after_another_download)
    with caplog.at_level(logging.INFO, logger="attncnn.api.downloads"):
        folder = attncnn.download("tiny", source, manifest=manifest)
    assert other == [folder] and [p.relative_to(folder).as_posix() for p in _files_in(folder)] == sorted(FILES)
    assert any("another download stored it" in r.getMessage() for r in caplog.records)
    assert [p.name for p in (cache / "models").iterdir()] == ["paper-long"]


def test_a_killed_downloads_folder_is_removed_by_the_next_download_and_a_live_ones_kept(cache, fake):
    source, manifest = fake
    models = cache / "models"
    models.mkdir(parents=True)
    for name in ("dead", "live", "old", "young"):
        (models / f".download-{name}" / "checkpoints").mkdir(parents=True)
        (models / f".download-{name}" / "config.json").write_text("{}")
    for name in ("dead", "live"):            # the locks of a killed download and of a running one
        (models / f".download-{name}.lock").write_text("attncnn download, pid 1\n")
    live = os.open(models / ".download-live.lock", os.O_RDWR)
    fcntl.flock(live, fcntl.LOCK_EX | fcntl.LOCK_NB)
    two_days = time.time() - 2 * 24 * 3600      # without a lock file: a version that took none; removed when old
    os.utime(models / ".download-old", (two_days, two_days))
    try:
        attncnn.download("tiny", source, manifest=manifest)
        assert sorted(p.name for p in models.iterdir()) == [".download-live", ".download-live.lock",
                                                            ".download-young", "paper-long"]
    finally:
        os.close(live)
