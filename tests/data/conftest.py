"""Fixtures for the data tests: a private data folder, and builders of tiny fake data sets."""

from __future__ import annotations

import hashlib
import io
import pickle
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@pytest.fixture(autouse=True)
def _private_data_dir(tmp_path, monkeypatch):
    """Never touch the user's ~/.cache: the default data folder is a fresh temporary one."""
    monkeypatch.setenv("ATTNCNN_DATA_DIR", str(tmp_path / "default-data-dir"))


def md5_of(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def record_bytes(image: np.ndarray) -> bytes:
    """The official pixel layout, written independently of the reader: R plane, G plane, B plane."""
    assert image.shape == (3, 32, 32) and image.dtype == np.uint8
    return b"".join(image[c].tobytes(order="C") for c in range(3))


class FakeCifar:
    """Builds tiny CIFAR-like folders / archives and remembers what it wrote."""

    def __init__(self, root: Path, dataset: str, kind: str, n: int = 4, seed: int = 0):
        self.root, self.dataset, self.kind, self.n = root, dataset, kind, n
        self.rng = np.random.default_rng(seed)
        self.num_classes = 10 if dataset == "cifar10" else 100
        if dataset == "cifar10":
            self.classes = CIFAR10_CLASSES
            self.folder = "cifar-10-batches-bin" if kind == "binary" else "cifar-10-batches-py"
            self.archive = "cifar-10-binary.tar.gz" if kind == "binary" else "cifar-10-python.tar.gz"
        else:
            self.classes = tuple(f"fine_{i:02d}" for i in range(100))
            self.folder = "cifar-100-binary" if kind == "binary" else "cifar-100-python"
            self.archive = "cifar-100-binary.tar.gz" if kind == "binary" else "cifar-100-python.tar.gz"

    def _batch(self):
        images = self.rng.integers(0, 256, size=(self.n, 3, 32, 32), dtype=np.uint8)
        labels = self.rng.integers(0, self.num_classes, size=self.n).astype(np.int64)
        return images, labels

    def write_folder(self, dest: Path) -> Path:
        """Write the extracted folder into ``dest``; sets train/test expectations."""
        folder = dest / self.folder
        folder.mkdir(parents=True)
        if self.dataset == "cifar10":
            train_names = [f"data_batch_{i}" for i in range(1, 6)]
            test_name = "test_batch"
        else:
            train_names, test_name = ["train"], "test"
        ext = ".bin" if self.kind == "binary" else ""
        train = [self._batch() for _ in train_names]
        test = self._batch()
        for name, batch in [*zip(train_names, train), (test_name, test)]:
            self._write_batch(folder / (name + ext), *batch)
        self._write_names(folder)
        self.train_images = np.concatenate([b[0] for b in train])
        self.train_labels = np.concatenate([b[1] for b in train])
        self.test_images, self.test_labels = test
        return folder

    def _write_batch(self, path: Path, images, labels):
        if self.kind == "binary":
            out = bytearray()
            for img, lab in zip(images, labels):
                if self.dataset == "cifar10":
                    out += bytes([int(lab)])
                else:
                    out += bytes([int(lab) % 20, int(lab)])  # coarse, fine
                out += record_bytes(img)
            path.write_bytes(bytes(out))
        else:
            key = "labels" if self.dataset == "cifar10" else "fine_labels"
            d = {"batch_label": "fake", key: [int(x) for x in labels],
                 "data": np.stack([np.frombuffer(record_bytes(i), np.uint8) for i in images]),
                 "filenames": [f"img_{i}.png" for i in range(len(labels))]}
            if self.dataset == "cifar100":
                d["coarse_labels"] = [int(x) % 20 for x in labels]
            path.write_bytes(pickle.dumps(d, protocol=4))

    def _write_names(self, folder: Path):
        if self.kind == "binary":
            name = "batches.meta.txt" if self.dataset == "cifar10" else "fine_label_names.txt"
            (folder / name).write_text("\n".join(self.classes) + "\n\n")
            if self.dataset == "cifar100":
                (folder / "coarse_label_names.txt").write_text("\n".join(f"c{i}" for i in range(20)) + "\n")
        else:
            if self.dataset == "cifar10":
                meta, name = {"label_names": list(self.classes), "num_cases_per_batch": self.n}, "batches.meta"
            else:
                meta, name = {"fine_label_names": list(self.classes),
                              "coarse_label_names": [f"c{i}" for i in range(20)]}, "meta"
            (folder / name).write_bytes(pickle.dumps(meta, protocol=4))

    md5_of = staticmethod(md5_of)

    def write_archive(self, data_dir: Path, monkeypatch=None) -> Path:
        """Write ``<data_dir>/<archive>`` (folder staged elsewhere); patch its md5 in if asked."""
        stage = self.root / f"stage-{self.folder}"
        folder = self.write_folder(stage)
        data_dir.mkdir(parents=True, exist_ok=True)
        archive = data_dir / self.archive
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(folder, arcname=self.folder)
        if monkeypatch is not None:
            from attncnn.data import cifar
            monkeypatch.setitem(cifar.MD5, self.archive, md5_of(archive))
        return archive


@pytest.fixture
def fake_cifar(tmp_path):
    def make(dataset="cifar10", kind="binary", n=4, seed=0):
        return FakeCifar(tmp_path, dataset, kind, n=n, seed=seed)
    return make


def png_bytes(arr: np.ndarray, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


class FakeImages:
    """A tiny ``train/<class>/*.png`` + ``test/<class>/*.png`` tree with known pixels (HWC uint8)."""

    png_bytes = staticmethod(png_bytes)

    def __init__(self, classes=("cat", "ant", "bee"), n_train=3, n_test=2, size=(6, 8), seed=0):
        rng = np.random.default_rng(seed)
        self.classes = tuple(sorted(classes))
        self.files: dict[str, bytes] = {}
        self.expected = {}
        for split, n in (("train", n_train), ("test", n_test)):
            imgs, labels = [], []
            for k, c in enumerate(self.classes):
                for i in range(n):
                    arr = rng.integers(0, 256, size=(*size, 3), dtype=np.uint8)
                    self.files[f"{split}/{c}/{i:03d}.png"] = png_bytes(arr)
                    imgs.append(arr.transpose(2, 0, 1))
                    labels.append(k)
            self.expected[split] = (np.stack(imgs), np.array(labels))

    def assert_loaded(self, ds) -> None:
        """``ds`` (a loaded Dataset) holds exactly these classes, labels and pixels."""
        assert ds.classes == self.classes
        for split in ("train", "test"):
            s = getattr(ds, split)
            images, labels = self.expected[split]
            np.testing.assert_array_equal(s.images.numpy(), images)  # PNG round-trips exactly
            np.testing.assert_array_equal(s.labels.numpy(), labels)

    def write_folder(self, root: Path, prefix: str = "") -> Path:
        for name, data in self.files.items():
            p = root / prefix / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        return root

    def write_zip(self, path: Path, prefix: str = "", extra: dict[str, bytes] | None = None) -> Path:
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
            for name, data in {**self.files, **(extra or {})}.items():
                zf.writestr(prefix + name, data)
        return path


@pytest.fixture
def fake_images():
    return FakeImages
