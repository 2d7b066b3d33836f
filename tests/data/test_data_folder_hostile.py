"""Image folders and zips that an adversarial or careless user might hand over: symbolic links,
a single class, oversized zip members and images, decompression bombs. Each is read correctly or
refused with a DataError naming the file, folder or member; none is silently misread."""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
import struct
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

import attncnn.data as data
from attncnn.data import DataError, load_dataset, peek_dataset
from attncnn.data import folder as data_folder
from attncnn.data.cache import cache_file, cache_key, write_cache

MIB = 2**20


def _link_class_elsewhere(root, elsewhere, name):
    """Move ``<root>/{train,test}/<name>`` under ``elsewhere`` and leave symbolic links in their place."""
    for split in ("train", "test"):
        target = elsewhere / f"{split}-{name}"
        shutil.move(root / split / name, target)
        (root / split / name).symlink_to(target, target_is_directory=True)


# ------------------------------------------------------------------------------ symbolic links

def test_symlinked_class_folders_are_followed_by_loading_and_peeking(fake_images, tmp_path):
    fake = fake_images()                                        # classes ant, bee, cat
    root = fake.write_folder(tmp_path / "imgs")
    (tmp_path / "elsewhere").mkdir()
    _link_class_elsewhere(root, tmp_path / "elsewhere", "ant")  # label 0: dropping it would shift the others
    ds = load_dataset(root, data_dir=tmp_path / "cache")
    fake.assert_loaded(ds)                                      # 3 classes, every label and pixel as written
    assert data.peek_dataset(root, data_dir=tmp_path / "cache") == ds.shape
    assert ds.shape.num_classes == 3


def test_a_changed_or_repointed_linked_class_folder_changes_the_cache_key(fake_images, tmp_path):
    fake = fake_images()
    root = fake.write_folder(tmp_path / "imgs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _link_class_elsewhere(root, elsewhere, "ant")
    cache = tmp_path / "cache"
    keys = [cache_key(root)]
    load_dataset(root, data_dir=cache)
    new = fake_images.png_bytes(np.full((6, 8, 3), 7, np.uint8))
    (elsewhere / "train-ant" / "999.png").write_bytes(new)       # a file added behind the link
    keys.append(cache_key(root))
    ds = load_dataset(root, data_dir=cache)
    assert len(ds.train) == 10 and (ds.train.images[3] == 7).all()  # decoded again, not the stale cache
    copy = elsewhere / "copy-of-train-ant"
    shutil.copytree(elsewhere / "train-ant", copy)              # same names, sizes and times (copy2)
    (root / "train" / "ant").unlink()
    (root / "train" / "ant").symlink_to(copy, target_is_directory=True)
    keys.append(cache_key(root))
    assert len(set(keys)) == 3


def test_a_symlink_loop_is_refused_naming_the_link(fake_images, tmp_path):
    root = fake_images().write_folder(tmp_path / "imgs")
    (root / "train" / "zz").symlink_to(root / "train", target_is_directory=True)
    with pytest.raises(DataError, match=r"train/zz leads back to .*train, a folder that contains it"):
        load_dataset(root, data_dir=tmp_path / "cache")
    with pytest.raises(DataError, match=r"train/zz leads back"):
        peek_dataset(root, data_dir=tmp_path / "cache")


def test_a_dangling_class_folder_link_is_refused_naming_it(fake_images, tmp_path):
    root = fake_images().write_folder(tmp_path / "imgs")
    (root / "test" / "dog").symlink_to(tmp_path / "nowhere", target_is_directory=True)
    with pytest.raises(DataError, match=r"test/dog is a symbolic link to .*nowhere, which does not exist"):
        load_dataset(root, data_dir=tmp_path / "cache")


def _symlink(link, target):
    try:
        link.symlink_to(target, target_is_directory=True)
    except (OSError, NotImplementedError) as err:          # Windows without the privilege, some file systems
        pytest.skip(f"symbolic links are not available here ({err})")


def test_a_test_class_folder_that_is_a_training_class_folder_is_refused_naming_both(fake_images, tmp_path):
    root = fake_images().write_folder(tmp_path / "imgs")
    shutil.rmtree(root / "test" / "bee")
    _symlink(root / "test" / "bee", root / "train" / "bee")
    message = re.escape(f"{root / 'test' / 'bee'} is the same folder as {root / 'train' / 'bee'} "
                        f"({os.path.realpath(root / 'train' / 'bee')}): its test images would also be training "
                        "images; give it the class's own held-out test images instead of a link to that folder")
    for read in (load_dataset, peek_dataset):
        with pytest.raises(DataError, match=f"^{message}$"):
            read(root, data_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()                # refused before anything is decoded or cached


def test_class_folders_of_both_splits_linked_to_one_folder_elsewhere_are_refused(fake_images, tmp_path):
    root = fake_images().write_folder(tmp_path / "imgs", prefix="wrapped/")
    shared = tmp_path / "cats"
    shutil.move(root / "wrapped" / "train" / "cat", shared)
    shutil.rmtree(root / "wrapped" / "test" / "cat")
    for split in ("train", "test"):
        _symlink(root / "wrapped" / split / "cat", shared)
    with pytest.raises(DataError, match=rf"wrapped/test/cat is the same folder as .*wrapped/train/cat "
                                        rf"\({re.escape(str(shared))}\)"):
        load_dataset(root, data_dir=tmp_path / "cache")
    with pytest.raises(DataError, match="wrapped/test/cat is the same folder"):
        data_folder.read_image_folder(root)


def test_a_test_split_that_is_the_training_split_is_refused(fake_images, tmp_path):
    root = fake_images().write_folder(tmp_path / "imgs")
    shutil.rmtree(root / "test")
    _symlink(root / "test", "train")                        # relative, as `ln -s train test` makes it
    with pytest.raises(DataError, match="^" + re.escape(f"{root / 'test'} is the same folder as {root / 'train'} "
                                                      f"({os.path.realpath(root / 'train')}): every test image "
                                                      "would be a training image")):
        load_dataset(root, data_dir=tmp_path / "cache")


def test_a_cached_copy_of_overlapping_splits_is_refused_too(fake_images, tmp_path, monkeypatch):
    """A decoded copy written before the check (by an older attncnn) is not served."""
    root = fake_images().write_folder(tmp_path / "imgs")
    shutil.rmtree(root / "test" / "ant")
    _symlink(root / "test" / "ant", root / "train" / "ant")
    cache = tmp_path / "cache"
    with monkeypatch.context() as m:                        # as an attncnn without the check decoded it
        m.setattr(data_folder, "check_splits_apart", lambda *args, **kwargs: None)
        m.setattr(data, "check_splits_apart", lambda *args, **kwargs: None)
        load_dataset(root, data_dir=cache)
    assert cache_file(cache, root).is_file()
    with pytest.raises(DataError, match="test/ant is the same folder as"):
        load_dataset(root, data_dir=cache)


def test_separate_class_folders_with_the_same_names_are_read(fake_images, tmp_path):
    fake = fake_images()
    root = fake.write_folder(tmp_path / "imgs")
    data_folder.check_splits_apart(root)
    fake.assert_loaded(load_dataset(root, data_dir=tmp_path / "cache"))


def test_an_unlistable_class_folder_is_refused_naming_it(fake_images, tmp_path, monkeypatch):
    root = fake_images().write_folder(tmp_path / "imgs")
    locked = {str(root / split / "bee") for split in ("train", "test")}    # dropping both would go unnoticed
    real_scandir = os.scandir

    def scandir(folder=".", *args, **kwargs):      # what a folder without read permission gives (even to root)
        if os.fspath(folder) in locked:
            raise PermissionError(13, "Permission denied", os.fspath(folder))
        return real_scandir(folder, *args, **kwargs)
    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(DataError, match=r"cannot list the folder .*(train|test)/bee \(Permission denied\)"):
        load_dataset(root, data_dir=tmp_path / "cache")


def _zip_with_links(path, files, links):
    """A zip as ``zip -y`` writes it: ``links`` (``{member: target}``) are stored as links."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, blob in files.items():
            zf.writestr(name, blob)
        for name, target in links.items():
            info = zipfile.ZipInfo(name)
            info.create_system = 3                               # Unix: the high bits of external_attr are st_mode
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return path


def test_a_zip_member_that_is_a_symlink_is_refused_naming_it(fake_images, tmp_path):
    fake = fake_images()
    files = {k: v for k, v in fake.files.items() if "/ant/" not in k}
    z = _zip_with_links(tmp_path / "a.zip", files, {"train/ant": "../../ant-train", "test/ant": "../../ant-test"})
    for read in (load_dataset, peek_dataset):
        with pytest.raises(DataError, match=r"(train|test)/ant inside .*a\.zip is a symbolic link.*without -y"):
            read(z, data_dir=tmp_path / "cache")
    # a link outside train/ and test/ is no class folder: left out like any other non-image
    z = _zip_with_links(tmp_path / "b.zip", fake.files, {"README": "docs/README.md"})
    fake.assert_loaded(load_dataset(z, data_dir=tmp_path / "cache"))


def test_hidden_class_folders_are_skipped_in_zips_as_in_folders(fake_images, tmp_path):
    fake = fake_images()
    hidden = {f"{s}/.hidden/000.png": fake.files["train/ant/000.png"] for s in ("train", "test")}
    root = fake.write_folder(tmp_path / "imgs")
    for name, blob in hidden.items():
        (root / name).parent.mkdir()
        (root / name).write_bytes(blob)
    z = fake.write_zip(tmp_path / "a.zip", extra=hidden)
    for where in (root, z):
        fake.assert_loaded(load_dataset(where, data_dir=tmp_path / "cache"))


# ------------------------------------------------------------------------------ a single class

@pytest.mark.parametrize("kind", ["folder", "zip"])
def test_a_single_class_is_refused_by_loading_and_peeking(fake_images, tmp_path, kind):
    fake = fake_images(classes=("ant",))
    where = fake.write_folder(tmp_path / "one") if kind == "folder" else fake.write_zip(tmp_path / "one.zip")
    for read in (load_dataset, peek_dataset):
        with pytest.raises(DataError) as err:
            read(where, data_dir=tmp_path / "cache")
        msg = str(err.value)
        assert str(where) in msg and "train/ant/" in msg and "at least two" in msg and "\n" not in msg
    assert not (tmp_path / "cache").exists()                    # nothing cached for it either


def test_a_cached_single_class_set_is_not_used(fake_images, tmp_path):
    """A cache written before one class was refused must not bring such a set back."""
    root = fake_images(classes=("ant",)).write_folder(tmp_path / "one")
    train, test = (data.ImageSplit(torch.zeros((n, 3, 6, 8), dtype=torch.uint8), torch.zeros(n, dtype=torch.int64))
                   for n in (3, 2))
    assert write_cache(cache_file(tmp_path / "cache", root), ("ant",), train, test)
    with pytest.raises(DataError, match="at least two"):
        load_dataset(root, data_dir=tmp_path / "cache")


def test_train_refuses_a_single_class_before_the_run_folder_exists(fake_images, tmp_path, capsys):
    from attncnn.cli import main
    root = fake_images(classes=("ant",), size=(8, 8)).write_folder(tmp_path / "one")
    out = tmp_path / "run"
    code = main(["train", "--preset", "demo", "--data", str(root), "--data-dir", str(tmp_path / "cache"),
                 "--out", str(out), "--device", "cpu", "--batch-size", "3", "--epochs", "1"])
    assert code != 0 and not out.exists()
    assert "at least two" in capsys.readouterr().err


# ------------------------------------------------------------------------------ sizes

def _zip_deflated(path, files):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, blob in files.items():
            zf.writestr(name, blob)
    return path


@pytest.fixture
def small_limit(monkeypatch):
    """The image size limit lowered to 1 MiB, so that 2 MiB of zeros stand for a zip bomb."""
    monkeypatch.setattr(data_folder, "MAX_IMAGE_BYTES", MIB)
    return MIB


@pytest.mark.parametrize("member", ["train/ant/zz.png", "train/ant/0.png"])   # the last, or the first read
def test_a_zip_member_declaring_more_than_the_limit_is_refused_unread(fake_images, tmp_path, monkeypatch,
                                                                      small_limit, member):
    fake = fake_images()
    z = _zip_deflated(tmp_path / "bomb.zip", {**fake.files, member: bytes(2 * MIB)})
    opened = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, name, *a, **k: opened.append(
        getattr(name, "filename", name)) or real_open(self, name, *a, **k))
    reads = (load_dataset, peek_dataset) if member.endswith("0.png") else (load_dataset,)
    for read in reads:
        with pytest.raises(DataError) as err:
            read(z, data_dir=tmp_path / "cache")
        msg = str(err.value)
        assert member in msg and str(z) in msg and f"{2 * MIB:,}" in msg and f"{small_limit:,} bytes" in msg
    assert member not in opened                                 # refused from the central directory alone


def _declare_size(zip_path, member, size):
    """Overwrite ``member``'s uncompressed size in the zip's central directory (a lying zip)."""
    raw = bytearray(zip_path.read_bytes())
    name = member.encode()
    at = raw.index(b"PK\x01\x02")
    while raw[at + 46:at + 46 + len(name)] != name:             # the central directory record of ``member``
        at = raw.index(b"PK\x01\x02", at + 4)
    raw[at + 24:at + 28] = struct.pack("<I", size)
    zip_path.write_bytes(bytes(raw))


def test_a_zip_member_larger_than_it_declares_is_refused(fake_images, tmp_path, small_limit):
    fake = fake_images()
    member = "train/ant/zz.png"
    z = _zip_deflated(tmp_path / "liar.zip", {**fake.files, member: bytes(2 * MIB)})
    _declare_size(z, member, 1000)
    with zipfile.ZipFile(z) as zf:
        assert zf.getinfo(member).file_size == 1000
    with pytest.raises(DataError) as err:
        load_dataset(z, data_dir=tmp_path / "cache")
    assert member in str(err.value) and str(z) in str(err.value)


class _CountingStream(io.BytesIO):
    def __init__(self, blob):
        super().__init__(blob)
        self.taken = 0

    def read(self, n=-1):
        out = super().read(n)
        self.taken += len(out)
        return out


def test_the_bounded_read_never_takes_more_than_the_limit_plus_one_byte():
    stream = _CountingStream(bytes(2 * MIB))                    # a stream that inflates past any declared size
    with pytest.raises(DataError, match=r"image m\.png \(inside z\.zip\) holds more than 1,048,576 bytes"):
        data_folder._read_bounded(stream, "m.png (inside z.zip)", limit=MIB)
    assert stream.taken == MIB + 1
    assert data_folder._read_bounded(_CountingStream(bytes(MIB)), "m.png", limit=MIB) == bytes(MIB)


def test_a_folder_image_larger_than_the_limit_is_refused_naming_it(fake_images, tmp_path, small_limit):
    root = fake_images().write_folder(tmp_path / "imgs")
    big = root / "test" / "bee" / "huge.png"
    big.write_bytes(bytes(2 * MIB))
    with pytest.raises(DataError) as err:
        load_dataset(root, data_dir=tmp_path / "cache")
    assert str(big) in str(err.value) and f"{small_limit:,} bytes" in str(err.value)


@pytest.mark.parametrize("max_pixels", [30, 10])   # 6x8 = 48 pixels: Pillow warns above 30, fails above 2 x 10
def test_a_decompression_bomb_is_refused_naming_the_file(fake_images, tmp_path, monkeypatch, max_pixels):
    root = fake_images().write_folder(tmp_path / "imgs")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", max_pixels)
    with pytest.raises(DataError, match=r"cannot read image .*train/ant/000\.png .*decompression bomb.*remove or "
                                        r"replace that file"):
        load_dataset(root, data_dir=tmp_path / "cache")
