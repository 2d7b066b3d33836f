"""Image folders and zips, the load_dataset dispatcher, and the decoded-image cache."""

from __future__ import annotations

import logging
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

import attncnn.data as data
from attncnn.data import DataError, ImageSplit, default_data_dir, load_dataset
from attncnn.data.cache import cache_file, read_cache, write_cache


def _check(ds, fake):
    assert ds.classes == fake.classes
    for split in ("train", "test"):
        s = getattr(ds, split)
        images, labels = fake.expected[split]
        assert s.images.dtype == torch.uint8 and s.labels.dtype == torch.int64
        np.testing.assert_array_equal(s.images.numpy(), images)  # PNG round-trips exactly
        np.testing.assert_array_equal(s.labels.numpy(), labels)


def test_folder_round_trip(fake_images, tmp_path):
    fake = fake_images()
    root = fake.write_folder(tmp_path / "imgs")
    (root / "train" / "ant" / "notes.txt").write_text("not an image")
    (root / "train" / "ant" / ".hidden.png").write_bytes(b"junk")
    (root / "README").write_text("ignored")
    ds = load_dataset(str(root), data_dir=tmp_path / "cache")
    _check(ds, fake)
    assert ds.classes == ("ant", "bee", "cat")  # labels follow sorted folder names
    assert ds.train.images.shape == (9, 3, 6, 8)  # H, W come from the data
    assert ds.name == "imgs" and "folder" in ds.source and str(root) in ds.source


@pytest.mark.parametrize("prefix", ["", "wrapped/"])
def test_zip_round_trip(fake_images, tmp_path, prefix):
    fake = fake_images()
    z = fake.write_zip(tmp_path / "set.zip", prefix=prefix, extra={"__MACOSX/._x": b"", f"{prefix}train/": b""}
                       if not prefix else None)
    ds = load_dataset(z, data_dir=tmp_path / "cache")
    _check(ds, fake)
    assert ds.name == "set.zip" and "zip" in ds.source


def test_formats_and_modes(fake_images, tmp_path):
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, size=(4, 4), dtype=np.uint8)
    rgba = rng.integers(0, 256, size=(4, 4, 4), dtype=np.uint8)
    root = tmp_path / "mixed"
    files = {
        "train/a/x.PNG": fake_images.png_bytes(rgb),
        "train/a/y.bmp": fake_images.png_bytes(rgb, "BMP"),
        "train/b/z.jpeg": fake_images.png_bytes(rgb, "JPEG"),
        "train/b/w.Jpg": fake_images.png_bytes(rgb, "JPEG"),
        "test/a/g.png": fake_images.png_bytes(gray),
        "test/b/r.png": fake_images.png_bytes(rgba),
    }
    for name, blob in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(blob)
    ds = load_dataset(root, data_dir=tmp_path / "cache")
    assert ds.train.labels.tolist() == [0, 0, 1, 1]
    np.testing.assert_array_equal(ds.train.images[0].numpy(), rgb.transpose(2, 0, 1))
    np.testing.assert_array_equal(ds.train.images[1].numpy(), rgb.transpose(2, 0, 1))
    for i, name in ((2, "train/b/w.Jpg"), (3, "train/b/z.jpeg")):  # lossy: compare with Pillow's own decode
        with Image.open(root / name) as im:
            np.testing.assert_array_equal(ds.train.images[i].numpy(), np.asarray(im.convert("RGB")).transpose(2, 0, 1))
    np.testing.assert_array_equal(ds.test.images[0].numpy(), np.stack([gray] * 3))  # gray -> RGB
    np.testing.assert_array_equal(ds.test.images[1].numpy(), rgba[..., :3].transpose(2, 0, 1))


def _zip(path, files):
    with zipfile.ZipFile(path, "w") as zf:
        for name, blob in files.items():
            zf.writestr(name, blob)
    return path


def test_missing_test_split(fake_images, tmp_path):
    fake = fake_images()
    z = _zip(tmp_path / "a.zip", {k: v for k, v in fake.files.items() if k.startswith("train/")})
    with pytest.raises(DataError, match="no images in test/"):
        load_dataset(z, data_dir=tmp_path)


def test_missing_train_split(fake_images, tmp_path):
    fake = fake_images()
    root = tmp_path / "only-test"
    for name, blob in fake.files.items():
        if name.startswith("test/"):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(blob)
    with pytest.raises(DataError, match="no train/ folder"):
        load_dataset(root, data_dir=tmp_path)


def test_class_missing_in_test(fake_images, tmp_path):
    fake = fake_images()
    z = _zip(tmp_path / "a.zip", {k: v for k, v in fake.files.items() if not k.startswith("test/bee/")})
    with pytest.raises(DataError, match="test/bee/"):
        load_dataset(z, data_dir=tmp_path)


def test_extra_class_in_test(fake_images, tmp_path):
    fake = fake_images()
    z = _zip(tmp_path / "a.zip", {**fake.files, "test/zebra/1.png": fake.files["test/ant/000.png"]})
    with pytest.raises(DataError, match="train/zebra/"):
        load_dataset(z, data_dir=tmp_path)


def test_odd_size_names_file(fake_images, tmp_path):
    fake = fake_images()
    odd = fake_images.png_bytes(np.zeros((5, 5, 3), np.uint8))
    z = _zip(tmp_path / "a.zip", {**fake.files, "test/cat/999.png": odd})
    with pytest.raises(DataError, match=r"test/cat/999.png .*5x5 .*8x6"):
        load_dataset(z, data_dir=tmp_path)


def test_unreadable_image_names_file_inside_zip(fake_images, tmp_path):
    fake = fake_images()
    z = _zip(tmp_path / "a.zip", {**fake.files, "train/bee/broken.png": b"\x89PNG garbage"})
    with pytest.raises(DataError) as err:
        load_dataset(z, data_dir=tmp_path)
    assert "train/bee/broken.png" in str(err.value) and str(z) in str(err.value)


def test_bad_zip(tmp_path):
    z = tmp_path / "broken.zip"
    z.write_bytes(b"this is not a zip")
    with pytest.raises(DataError, match="not a readable zip"):
        load_dataset(z, data_dir=tmp_path)


def test_unknown_spec_names_choices(tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset("imagenet", data_dir=tmp_path)
    msg = str(err.value)
    assert "cifar10" in msg and "cifar100" in msg and "imagenet" in msg
    other = tmp_path / "file.txt"
    other.write_text("x")
    with pytest.raises(DataError, match="neither a folder nor a .zip"):
        load_dataset(other, data_dir=tmp_path)


def test_default_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNCNN_DATA_DIR", str(tmp_path / "explicit"))
    assert default_data_dir() == tmp_path / "explicit"
    monkeypatch.delenv("ATTNCNN_DATA_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "attncnn"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_dir() == tmp_path / "home" / ".cache" / "attncnn"


def test_default_data_dir_used_for_cache(fake_images, tmp_path):
    z = fake_images().write_zip(tmp_path / "a.zip")
    load_dataset(z)
    assert cache_file(default_data_dir(), z).is_file()


# ----------------------------------------------------------------------------------------------- cache

def _fail(*args, **kwargs):
    raise AssertionError("the images were decoded again instead of read from the cache")


def test_second_load_uses_cache(fake_images, tmp_path, monkeypatch):
    fake = fake_images()
    z = fake.write_zip(tmp_path / "a.zip")
    cache = tmp_path / "cache"
    first = load_dataset(z, data_dir=cache)
    stored = cache_file(cache, z)
    assert stored.is_file() and stored.parent == cache / "decoded" and stored.suffix == ".safetensors"
    monkeypatch.setattr(data, "read_image_folder", _fail)
    second = load_dataset(z, data_dir=cache)
    _check(second, fake)
    assert second.classes == first.classes and second.source == first.source


def test_corrupt_cache_is_rebuilt(fake_images, tmp_path, caplog):
    fake = fake_images()
    root = fake.write_folder(tmp_path / "imgs")
    cache = tmp_path / "cache"
    load_dataset(root, data_dir=cache)
    stored = cache_file(cache, root)
    stored.write_bytes(stored.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="attncnn.data"):
        ds = load_dataset(root, data_dir=cache)
    _check(ds, fake)
    assert any("unreadable cache" in r.getMessage() for r in caplog.records)
    assert read_cache(stored) is not None  # rewritten


def test_changed_folder_changes_key(fake_images, tmp_path):
    fake = fake_images()
    root = fake.write_folder(tmp_path / "imgs")
    cache = tmp_path / "cache"
    old = cache_file(cache, root)
    load_dataset(root, data_dir=cache)
    (root / "train" / "ant" / "extra.png").write_bytes(fake.files["train/ant/000.png"])
    new = cache_file(cache, root)
    assert new != old
    ds = load_dataset(root, data_dir=cache)
    assert len(ds.train) == 10
    assert new.is_file() and not old.exists()  # stale cache of the same path removed


def test_unwritable_cache_only_warns(fake_images, tmp_path, caplog):
    fake = fake_images()
    z = fake.write_zip(tmp_path / "a.zip")
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="attncnn.data"):
        _check(load_dataset(z, data_dir=blocker), fake)
    assert any("could not write" in r.getMessage() for r in caplog.records)


def test_cache_round_trip_direct(tmp_path):
    train = ImageSplit(torch.randint(0, 256, (5, 3, 4, 4), dtype=torch.uint8), torch.tensor([0, 1, 1, 0, 1]))
    test = ImageSplit(torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8), torch.tensor([1, 0]))
    f = tmp_path / "x.safetensors"
    assert write_cache(f, ("no", "yes"), train, test)
    classes, tr, te = read_cache(f)
    assert classes == ("no", "yes")
    assert torch.equal(tr.images, train.images) and torch.equal(te.labels, test.labels)
    assert read_cache(tmp_path / "missing.safetensors") is None


# --- empty, truncated or corrupt inputs: each message names the file and the fix ----------------

def test_empty_zip_file(tmp_path):
    z = tmp_path / "empty.zip"
    z.write_bytes(b"")
    with pytest.raises(DataError, match=r"empty.zip is not a readable zip file.*re-create or re-download"):
        load_dataset(z, data_dir=tmp_path)


def test_zip_without_entries(tmp_path):
    z = tmp_path / "nothing.zip"
    with zipfile.ZipFile(z, "w"):
        pass
    with pytest.raises(DataError, match=r"nothing.zip has no train/ folder; expected train/<class>/<image>"):
        load_dataset(z, data_dir=tmp_path)


def test_truncated_zip(fake_images, tmp_path):
    z = fake_images().write_zip(tmp_path / "full.zip")
    cut = tmp_path / "cut.zip"
    cut.write_bytes(z.read_bytes()[: z.stat().st_size // 2])
    with pytest.raises(DataError, match=r"cut.zip is not a readable zip file.*re-create or re-download"):
        load_dataset(cut, data_dir=tmp_path)


def test_corrupt_member_of_a_zip(fake_images, tmp_path):
    z = fake_images().write_zip(tmp_path / "a.zip")
    raw = bytearray(z.read_bytes())
    name = b"train/bee/001.png"
    at = raw.index(name) + len(name) + 60          # inside that member's stored bytes
    raw[at:at + 20] = bytes(20)
    z.write_bytes(bytes(raw))
    with pytest.raises(DataError) as err:
        load_dataset(z, data_dir=tmp_path)
    assert "train/bee/001.png" in str(err.value) and str(z) in str(err.value)
    assert "re-create or re-download" in str(err.value) or "remove or replace" in str(err.value)


def test_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="has no train/ folder"):
        load_dataset(tmp_path / "empty", data_dir=tmp_path)


def test_unreadable_jpeg_in_a_folder_names_the_file(fake_images, tmp_path):
    root = fake_images().write_folder(tmp_path / "images")
    bad = root / "train" / "cat" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0" + b"not really a JPEG")
    with pytest.raises(DataError, match="remove or replace that file") as err:
        load_dataset(root, data_dir=tmp_path)
    assert str(bad) in str(err.value)


def test_split_with_class_folders_but_no_images(fake_images, tmp_path):
    root = fake_images().write_folder(tmp_path / "images")
    for f in (root / "test").rglob("*.png"):
        f.unlink()
    (root / "test" / "cat" / "notes.txt").write_text("not an image")
    with pytest.raises(DataError, match=r"no images in test/<class>/; expected test/<class>/<image>"):
        load_dataset(root, data_dir=tmp_path)


def test_an_unchanged_cache_file_is_read_once_per_process(fake_images, tmp_path, monkeypatch):
    """The plan of `attncnn train` and the run load the same data set: the second load reuses the
    tensors of the first; a cache file written since is read again."""
    from attncnn.data import cache as data_cache
    fake = fake_images()
    z = fake.write_zip(tmp_path / "a.zip")
    cache = tmp_path / "cache"
    load_dataset(z, data_dir=cache)                             # decodes and writes the cache
    first = load_dataset(z, data_dir=cache)                     # reads it
    with monkeypatch.context() as m:
        m.setattr(data_cache, "safe_open", lambda *a, **k: pytest.fail("the unchanged file was read again"))
        second = load_dataset(z, data_dir=cache)
    assert second.train.images is first.train.images and second.classes == first.classes
    _check(second, fake)
    stored = cache_file(cache, z)
    flipped = ImageSplit(255 - first.train.images, first.train.labels)
    assert write_cache(stored, first.classes, flipped, first.test)
    _, train, _ = read_cache(stored)
    assert torch.equal(train.images, flipped.images)


@pytest.mark.parametrize("kind", ["folder", "zip", "wrapped zip"])
def test_peek_gives_the_sizes_that_loading_gives_without_decoding(fake_images, tmp_path, monkeypatch, kind):
    fake = fake_images()
    where = (fake.write_folder(tmp_path / "imgs") if kind == "folder"
             else fake.write_zip(tmp_path / "set.zip", prefix="wrapped/" if kind == "wrapped zip" else ""))
    loaded = load_dataset(where, data_dir=tmp_path / "cache")
    decoded = []
    monkeypatch.setattr(data.folder, "_decode", lambda blob, name: decoded.append(name) or np.zeros((6, 8, 3)))
    peeked = data.peek_dataset(where, data_dir=tmp_path / "cache")
    assert peeked == loaded.shape == data.DataShape(where.name, 9, 6, 3, (3, 6, 8))
    assert len(decoded) == 1 and "train/ant/" in decoded[0]       # the first training image alone


def test_peek_knows_cifar_without_files_and_refuses_what_loading_refuses(fake_images, tmp_path):
    assert data.peek_dataset("CIFAR10", data_dir=tmp_path) == data.DataShape("cifar10", 50_000, 10_000, 10,
                                                                              (3, 32, 32))
    assert data.peek_dataset("cifar100", data_dir=tmp_path).num_classes == 100
    assert not any(tmp_path.iterdir())
    with pytest.raises(DataError, match="unknown data set 'nowhere'"):
        data.peek_dataset("nowhere", data_dir=tmp_path)
    fake = fake_images()
    z = _zip(tmp_path / "a.zip", {k: v for k, v in fake.files.items() if not k.startswith("test/bee/")})
    with pytest.raises(DataError, match="test/bee/"):
        data.peek_dataset(z, data_dir=tmp_path)
    z = _zip(tmp_path / "b.zip", {**fake.files, "train/ant/000.png": b"\x89PNG garbage"})
    with pytest.raises(DataError, match="train/ant/000.png"):
        data.peek_dataset(z, data_dir=tmp_path)
