"""Trained models fetched on request into the user cache: :func:`download` (``attncnn download``).

The width-400 models of ``results/paper-long`` are too large for the wheel: ``attncnn download
NAME --from SOURCE`` copies one into ``<user cache>/models/`` (:func:`downloads_folder`), where
:func:`attncnn.pretrained` finds it. The source is a copy of a clone's ``results/`` folder: a local
folder, or an ``http(s)://`` address serving the same paths.

Every file's size and sha256 are recorded in a manifest shipped with the package
(``attncnn/pretrained_models/downloads.json``, written by ``benchmarks/package_models.py``). Files
are written into a temporary folder (:mod:`attncnn.api.download_staging`), checked, and moved into
place with one rename, so a failed or interrupted download leaves nothing in the cache. A download
has a deadline as a whole. Nothing is downloaded unless :func:`download` is called.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import logging
import math
import os
import secrets
import shutil
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .._cache_dir import user_cache_dir
from .._io import file_sha256, make_folders
from ..errors import AttncnnError, InputError, MissingFileError, OutputError
from .download_staging import staging_folder

__all__ = ["DOWNLOADS_MANIFEST", "DownloadError", "MIN_RATE", "download", "downloadable", "downloads_folder",
           "read_manifest"]

log = logging.getLogger(__name__)

#: the manifest of the models :func:`download` fetches (name -> run folder under results/, files, sha256)
DOWNLOADS_MANIFEST = Path(__file__).resolve().parents[1] / "pretrained_models" / "downloads.json"
_BLOCK = 1 << 20
#: the slowest transfer the default deadline allows, bytes per second: below it a source is taken as stalled
MIN_RATE = 32 * 1024


class DownloadError(AttncnnError, OSError):
    """A download failed (unreachable source, missing file, cut transfer) or a file did not match
    its recorded size and sha256; nothing was put in the cache."""


def downloads_folder() -> Path:
    """Where downloaded models go: ``<user cache>/models`` (:func:`attncnn._cache_dir.user_cache_dir`:
    ``$ATTNCNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/attncnn``, else ``~/.cache/attncnn``), laid out
    like ``results/``. Only the path: nothing is created."""
    return user_cache_dir() / "models"


def read_manifest(path: str | os.PathLike | None = None) -> dict:
    """The models of a download manifest: ``{name: {"path": "paper-long/quadratic/seed0",
    "files": {"config.json": {"bytes": int, "sha256": hex}, ...}, ...}}``.

    Args:
        path: a manifest file of the same format (default :data:`DOWNLOADS_MANIFEST`, the package's).

    Raises:
        MissingFileError: no such file. InputError: not a manifest (the message names the file).
    """
    path = Path(path) if path is not None else DOWNLOADS_MANIFEST
    try:
        models = json.loads(path.read_text())["models"]
    except FileNotFoundError as err:
        raise MissingFileError(f"no download manifest at {path}") from err
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"{path} is not a download manifest: {err}") from err
    for name, entry in models.items():
        ok = (isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("files"), dict)
              and all(isinstance(f, dict) and isinstance(f.get("bytes"), int) and isinstance(f.get("sha256"), str)
                      for f in entry["files"].values()))
        parts = Path(entry.get("path", "") if isinstance(entry, dict) else "").parts
        if not ok or not parts or Path(entry["path"]).is_absolute() or ".." in parts or any(
                Path(f).is_absolute() or ".." in Path(f).parts for f in entry["files"]):
            raise InputError(f"{path}: entry {name!r} is not a model (a relative 'path' and 'files' with 'bytes' "
                             "and 'sha256' each)")
    return models


def downloadable(manifest: str | os.PathLike | None = None) -> list[str]:
    """The names :func:`download` takes (``["learned", "quadratic", ...]``), sorted."""
    return sorted(read_manifest(manifest))



def _complete(folder: Path, files: dict) -> bool:
    """Whether ``folder`` holds every file of ``files`` with its recorded size and sha256."""
    return all((folder / rel).is_file() and (folder / rel).stat().st_size == spec["bytes"]
               and file_sha256(folder / rel) == spec["sha256"] for rel, spec in files.items())


def _is_url(source: str) -> bool:
    return urllib.parse.urlsplit(source).scheme.lower() in ("http", "https")


def _open(source: str, rel: str, timeout: float):
    """A binary stream of the file ``rel`` (``paper-long/quadratic/seed0/config.json``) of ``source``."""
    if _is_url(source):
        url = source.rstrip("/") + "/" + urllib.parse.quote(rel)
        try:
            return urllib.request.urlopen(url, timeout=timeout)     # noqa: S310 (http(s) only: checked above)
        except urllib.error.HTTPError as err:
            raise DownloadError(f"{url}: HTTP {err.code} {err.reason}; the source must serve a copy of a clone's "
                                f"results/ folder, with this file at {rel}") from err
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
            raise DownloadError(f"cannot download {url}: {getattr(err, 'reason', err)}; check the address and the "
                                "network") from err
    path = Path(source).expanduser() / rel
    try:
        # O_NONBLOCK: opening a FIFO would otherwise wait for a writer; the check below refuses it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError as err:
        raise MissingFileError(f"no {path}: the source folder must be laid out like a clone's results/ folder "
                               f"(this file at {rel})") from err
    except OSError as err:
        raise DownloadError(f"cannot read {path} of the source: {err.strerror or err}") from err
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise DownloadError(f"{path} of the source is {what}, not the file it must be; the source must be a copy of a "
                            f"clone's results/ folder, with this file at {rel}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _fetch(source: str, rel: str, dest: Path, spec: dict, timeout: float, deadline: "_Deadline") -> None:
    """Copy ``rel`` of ``source`` to ``dest``, refusing it unless its size and sha256 are ``spec``'s,
    and stopping once ``deadline`` has passed."""
    h, size, where = hashlib.sha256(), 0, f"{source.rstrip('/')}/{rel}"
    stream = _open(source, rel, min(timeout, deadline.left()))
    with stream, open(dest, "wb") as out:          # a failed write is an OSError: download() names the cache
        while size <= spec["bytes"]:                # one byte more than recorded is enough to refuse it
            deadline.check(where, size)
            try:
                # read1: one receive at most, so each waits no more than the timeout and the
                # deadline is checked between them (read() would gather a whole block, however slowly)
                block = stream.read1(min(_BLOCK, spec["bytes"] + 1 - size))
            except (http.client.HTTPException, OSError) as err:
                raise DownloadError(f"the transfer of {where} failed after {size:,} bytes: {err}") from err
            if not block:
                break
            h.update(block)
            out.write(block)
            size += len(block)
    if size > spec["bytes"]:
        raise DownloadError(f"{where}: got more than the {spec['bytes']:,} bytes the manifest records (another "
                            "file or another version of the model); it was not kept")
    if size < spec["bytes"]:
        raise DownloadError(f"{where}: got {size:,} bytes, the manifest records {spec['bytes']:,} (a cut transfer "
                            "or another file); it was not kept")
    if h.hexdigest() != spec["sha256"]:
        raise DownloadError(f"{where}: sha256 {h.hexdigest()} differs from the manifest's {spec['sha256']} (a "
                            "corrupt copy or another version of the model); it was not kept")


def _move_into_place(staging: Path, target: Path, files: dict) -> bool:
    """Rename the checked ``staging`` folder to ``target``, replacing an incomplete ``target`` and
    keeping a complete one (another process's download).

    Returns:
        True where this call put its folder in place, False where it kept another download's copy.
    """
    make_folders(target.parent)
    for _ in range(3):            # another download may change target between each check and rename
        if target.exists():
            if _complete(target, files):
                return False
            old = target.with_name(f".old-{secrets.token_hex(6)}")
            try:
                os.rename(target, old)
            except FileNotFoundError:
                continue          # another download moved it away first
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(staging, target)
            return True
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    if _complete(target, files):
        return False
    raise DownloadError(f"{target} kept changing while this download put its copy there (other downloads of the "
                        "same model?); run the download again once they have finished")


class _Deadline:
    """The end of a download as a whole: each read waits at most ``timeout``, and no read starts after it."""

    def __init__(self, seconds: float, why: str) -> None:
        self.seconds, self.why = seconds, why
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.001, self.end - time.monotonic())

    def check(self, where: str, size: int) -> None:
        if time.monotonic() > self.end:
            raise DownloadError(f"the download did not finish within {self.seconds:,.0f} s ({self.why}): {where} "
                                f"stalled after {size:,} bytes; the source is too slow or stalls. Try again, or allow "
                                "more time (deadline=..., --deadline SECONDS)")


def _checked_seconds(value, name: str) -> float:
    """``value`` as a positive finite number of seconds; InputError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise InputError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def _model(name: str, models: dict, manifest) -> tuple[str, dict]:
    """The manifest entry ``name`` means: its key, or its path with or without ``/seed<N>``."""
    for key, entry in models.items():
        if name in (key, entry["path"], entry["path"].rsplit("/", 1)[0]):
            return key, entry
    where = "" if manifest is None else f" in {manifest}"
    raise InputError(f"no downloadable model {name!r}{where}; the names are {', '.join(sorted(models))} (the "
                     "60-epoch mini models come with the package: attncnn.pretrained('quadratic-mini'))")


def download(name: str, source: str | os.PathLike, *, manifest: str | os.PathLike | None = None,
             timeout: float = 60.0, deadline: float | None = None) -> Path:
    """Copy a trained model into the user cache from ``source``, checking every file's sha256.

    Args:
        name: a model of the manifest (:func:`downloadable`: the width-400 runs of
            ``results/paper-long``, e.g. ``"quadratic"``), or its path there (``"paper-long/quadratic"``).
        source: an ``http(s)://`` address or a local folder laid out like a clone's ``results/``.
        manifest: a manifest file of the same format, for models hosted elsewhere (default: the
            package's, :data:`DOWNLOADS_MANIFEST`).
        timeout: seconds to wait for the server on each connection or read.
        deadline: seconds the whole download may take (default: ``timeout`` plus the model's size
            at :data:`MIN_RATE`).

    Returns:
        The model's run folder in the cache (``<cache>/models/paper-long/quadratic/seed0``), which
        :func:`attncnn.pretrained` then finds by name. A complete model already there is not fetched again.

    Raises:
        InputError: an unknown name (the message lists the names), a source of another kind, or a
            ``timeout`` or ``deadline`` that is not a positive number.
        MissingFileError: a source folder that does not exist or lacks a file.
        DownloadError: an unreachable server, an HTTP error, a cut transfer, a download past its
            deadline, a source file that is not a regular file, or a file whose size or sha256 is not
            the manifest's; nothing is left in the cache.
        OutputError: the cache folder is not writable.
    """
    timeout = _checked_seconds(timeout, "timeout")
    deadline = None if deadline is None else _checked_seconds(deadline, "deadline")
    models = read_manifest(manifest)
    key, entry = _model(name, models, manifest)
    source = os.fspath(source)
    if "://" in source and not _is_url(source):
        raise InputError(f"source {source!r}: give an http:// or https:// address or a local folder")
    if not _is_url(source) and not Path(source).expanduser().is_dir():
        raise MissingFileError(f"no folder {source}; give a folder laid out like a clone's results/ or an "
                               "http(s):// address")
    files, root = entry["files"], downloads_folder()
    target = root / entry["path"]
    if target.is_dir() and _complete(target, files):
        log.info("%s is already in %s", key, target)
        return target
    total = sum(spec["bytes"] for spec in files.values())
    until = _Deadline(deadline, "--deadline") if deadline is not None else \
        _Deadline(timeout + total / MIN_RATE, f"--timeout plus {total:,} bytes at {MIN_RATE // 1024} KiB/s")
    try:
        with staging_folder(make_folders(root)) as staging:
            for rel, spec in files.items():
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                log.info("%s: %s (%s bytes)", key, rel, f"{spec['bytes']:,}")
                _fetch(source, f"{entry['path']}/{rel}", staging / rel, spec, timeout, until)
            ours = _move_into_place(staging, target, files)
    except OSError as err:
        if isinstance(err, AttncnnError):
            raise
        raise OutputError(f"cannot write the model into {root}: {err.strerror or err}; set ATTNCNN_CACHE_DIR to "
                          "a writable folder") from err
    if ours:
        log.info("%s: %d files checked and stored in %s", key, len(files), target)
    else:
        log.info("%s: another download stored it in %s meanwhile, each file checked; kept that copy", key, target)
    return target
