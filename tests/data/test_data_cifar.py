"""Official CIFAR archives: parsing, md5, atomic extraction, download, safety."""

from __future__ import annotations

import io
import os
import pickle
import tarfile

import numpy as np
import pytest
import torch

from attncnn.data import DataError, load_dataset
from attncnn.data import cifar


def _no_leftovers(data_dir):
    return [p.name for p in data_dir.iterdir() if p.name.startswith(".")]


def _check(ds, fake):
    assert ds.classes == fake.classes
    assert ds.num_classes == fake.num_classes
    assert ds.train.images.dtype == torch.uint8 and ds.train.labels.dtype == torch.int64
    assert ds.train.images.shape == (5 * fake.n if fake.dataset == "cifar10" else fake.n, 3, 32, 32)
    np.testing.assert_array_equal(ds.train.images.numpy(), fake.train_images)
    np.testing.assert_array_equal(ds.train.labels.numpy(), fake.train_labels)
    np.testing.assert_array_equal(ds.test.images.numpy(), fake.test_images)
    np.testing.assert_array_equal(ds.test.labels.numpy(), fake.test_labels)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
@pytest.mark.parametrize("kind", ["binary", "python"])
def test_archive_is_verified_extracted_and_parsed(fake_cifar, tmp_path, monkeypatch, dataset, kind):
    fake = fake_cifar(dataset, kind)
    data_dir = tmp_path / "data"
    archive = fake.write_archive(data_dir, monkeypatch)
    ds = load_dataset(dataset.upper(), data_dir=data_dir)
    assert ds.name == dataset
    assert kind in ds.source and str(data_dir / fake.folder) in ds.source
    _check(ds, fake)
    assert (data_dir / fake.folder).is_dir() and archive.is_file()
    assert _no_leftovers(data_dir) == []
    # The extracted folder alone is enough the next time.
    archive.unlink()
    _check(load_dataset(dataset, data_dir=data_dir), fake)


def test_binary_record_layout(tmp_path):
    """Byte 0 is the label, then 1024 R, 1024 G, 1024 B values, each plane row-major 32x32."""
    record = bytearray(1 + 3072)
    record[0] = 7
    record[1 + 0 * 1024 + 0 * 32 + 1] = 11      # R at row 0, column 1
    record[1 + 1 * 1024 + 2 * 32 + 5] = 22      # G at row 2, column 5
    record[1 + 2 * 1024 + 31 * 32 + 30] = 33    # B at row 31, column 30
    path = tmp_path / "one.bin"
    path.write_bytes(bytes(record) * 2)
    images, labels = cifar.read_binary_batch(path, header=1, label_byte=0)
    assert images.shape == (2, 3, 32, 32) and labels.tolist() == [7, 7]
    assert images[0, 0, 0, 1] == 11 and images[0, 1, 2, 5] == 22 and images[0, 2, 31, 30] == 33
    assert int(images.sum()) == 2 * (11 + 22 + 33)


def test_data_dir_may_be_the_extracted_folder(fake_cifar, tmp_path):
    fake = fake_cifar("cifar10", "python")
    folder = fake.write_folder(tmp_path)
    _check(load_dataset("cifar10", data_dir=folder), fake)


def test_cifar100_uses_fine_labels(fake_cifar, tmp_path):
    fake = fake_cifar("cifar100", "binary", n=30)
    fake.write_folder(tmp_path)
    ds = load_dataset("cifar100", data_dir=tmp_path)
    assert ds.train.labels.max() >= 20  # coarse labels are < 20
    np.testing.assert_array_equal(ds.train.labels.numpy(), fake.train_labels)


def test_binary_preferred_over_python(fake_cifar, tmp_path):
    fake_cifar("cifar10", "python", seed=1).write_folder(tmp_path)
    binary = fake_cifar("cifar10", "binary", seed=2)
    binary.write_folder(tmp_path)
    _check(load_dataset("cifar10", data_dir=tmp_path), binary)


def test_md5_mismatch_names_file_and_leaves_nothing(fake_cifar, tmp_path):
    fake = fake_cifar("cifar10", "binary")
    data_dir = tmp_path / "data"
    archive = fake.write_archive(data_dir)  # md5 table not patched: the real md5 is expected
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", data_dir=data_dir)
    msg = str(err.value)
    assert str(archive) in msg and cifar.MD5[fake.archive] in msg and fake.md5_of(archive) in msg
    assert "delete" in msg and "--download" in msg
    assert not (data_dir / fake.folder).exists() and _no_leftovers(data_dir) == []


def test_truncated_archive_is_a_data_error(fake_cifar, tmp_path, monkeypatch):
    fake = fake_cifar("cifar10", "binary", n=50)
    data_dir = tmp_path / "data"
    archive = fake.write_archive(data_dir)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    monkeypatch.setitem(cifar.MD5, fake.archive, fake.md5_of(archive))  # so extraction itself is tried
    with pytest.raises(DataError, match="corrupt") as err:
        load_dataset("cifar10", data_dir=data_dir)
    assert str(archive) in str(err.value)
    assert not (data_dir / fake.folder).exists() and _no_leftovers(data_dir) == []


def test_truncated_batch_file_is_a_data_error(fake_cifar, tmp_path):
    fake = fake_cifar("cifar10", "binary")
    folder = fake.write_folder(tmp_path)
    bad = folder / "data_batch_3.bin"
    bad.write_bytes(bad.read_bytes()[:-100])
    with pytest.raises(DataError, match="truncated") as err:
        load_dataset("cifar10", data_dir=tmp_path)
    assert str(bad) in str(err.value)


def test_incomplete_folder_names_missing_file(fake_cifar, tmp_path):
    folder = fake_cifar("cifar10", "binary").write_folder(tmp_path)
    (folder / "test_batch.bin").unlink()
    with pytest.raises(DataError, match="test_batch.bin"):
        load_dataset("cifar10", data_dir=tmp_path)


def test_archive_without_expected_folder(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    archive = data_dir / "cifar-10-binary.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("something-else/readme.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    monkeypatch.setitem(cifar.MD5, archive.name, cifar._md5(archive))
    with pytest.raises(DataError, match="does not contain cifar-10-batches-bin/"):
        load_dataset("cifar10", data_dir=data_dir)
    assert not (data_dir / "cifar-10-batches-bin").exists() and _no_leftovers(data_dir) == []


@pytest.mark.parametrize("python_filter", [True, False], ids=["tarfile-data-filter", "own-checks"])
def test_path_traversal_in_archive_is_refused(tmp_path, monkeypatch, python_filter):
    if not python_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no tarfile data filter")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    archive = data_dir / "cifar-10-binary.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    monkeypatch.setitem(cifar.MD5, archive.name, cifar._md5(archive))
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", data_dir=data_dir)
    assert str(archive) in str(err.value)
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()
    assert _no_leftovers(data_dir) == []


def test_missing_data_lists_places_and_mentions_download(tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset("cifar100", data_dir=tmp_path)
    msg = str(err.value)
    for name in ("cifar-100-binary", "cifar-100-binary.tar.gz", "cifar-100-python", "cifar-100-python.tar.gz"):
        assert str(tmp_path / name) in msg
    assert "--download" in msg
    assert list(tmp_path.iterdir()) == []  # nothing downloaded or created


def test_download_from_url(fake_cifar, tmp_path, monkeypatch):
    fake = fake_cifar("cifar10", "binary")
    source = fake.write_archive(tmp_path / "server", monkeypatch)
    monkeypatch.setitem(cifar.URLS, fake.archive, source.as_uri())
    data_dir = tmp_path / "new" / "data"
    ds = load_dataset("cifar10", data_dir=data_dir, download=True)
    _check(ds, fake)
    assert (data_dir / fake.archive).read_bytes() == source.read_bytes()
    assert _no_leftovers(data_dir) == []


def test_download_with_wrong_md5_keeps_nothing(fake_cifar, tmp_path, monkeypatch):
    fake = fake_cifar("cifar10", "binary")
    source = fake.write_archive(tmp_path / "server")  # md5 not patched: it will not match
    monkeypatch.setitem(cifar.URLS, fake.archive, source.as_uri())
    data_dir = tmp_path / "data"
    with pytest.raises(DataError, match="md5"):
        load_dataset("cifar10", data_dir=data_dir, download=True)
    assert list(data_dir.iterdir()) == []


def test_unreachable_url(tmp_path, monkeypatch):
    url = (tmp_path / "nowhere" / "cifar-10-binary.tar.gz").as_uri()
    monkeypatch.setitem(cifar.URLS, "cifar-10-binary.tar.gz", url)
    data_dir = tmp_path / "data"
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", data_dir=data_dir, download=True)
    msg = str(err.value)
    assert "could not reach" in msg and url in msg and str(data_dir / "cifar-10-binary.tar.gz") in msg
    assert list(data_dir.iterdir()) == []


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_with_code_is_refused(fake_cifar, tmp_path):
    folder = fake_cifar("cifar10", "python").write_folder(tmp_path)
    marker = tmp_path / "pwned"
    (folder / "data_batch_1").write_bytes(pickle.dumps({"data": _Evil(marker)}, protocol=2))
    with pytest.raises(DataError, match="refused") as err:
        load_dataset("cifar10", data_dir=tmp_path)
    assert "system" in str(err.value) and str(folder / "data_batch_1") in str(err.value)
    assert not marker.exists()


def test_restricted_unpickler_allows_numpy_arrays_only(tmp_path):
    ok = tmp_path / "ok"
    ok.write_bytes(pickle.dumps({"data": np.arange(6, dtype=np.uint8).reshape(2, 3), "labels": [1, 2]}, protocol=4))
    out = cifar.safe_unpickle(ok)
    np.testing.assert_array_equal(out["data"], np.arange(6).reshape(2, 3))
    bad = tmp_path / "bad"
    bad.write_bytes(pickle.dumps({"x": collections_ordered_dict()}, protocol=4))
    with pytest.raises(DataError, match="collections.OrderedDict"):
        cifar.safe_unpickle(bad)


def collections_ordered_dict():
    import collections
    return collections.OrderedDict(a=1)
