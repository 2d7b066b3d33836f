"""The JPEG encoding read from a data set's files: IJG quality and chroma subsampling."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from PIL import Image

from attncnn.data import load_dataset
from attncnn.data.jpeg import JpegEncoding, describe_jpeg, ijg_quality, jpeg_encoding


def _jpeg(quality: int | None = None, subsampling: int = 2, qtables=None) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    options = {"qtables": qtables} if qtables is not None else {"quality": quality}
    Image.fromarray(pixels).save(out, "JPEG", subsampling=subsampling, **options)
    return out.getvalue()


@pytest.mark.parametrize("quality", [1, 10, 49, 50, 51, 75, 90, 95, 100])
@pytest.mark.parametrize("subsampling,name", [(0, "4:4:4"), (1, "4:2:2"), (2, "4:2:0")])
def test_pillow_encodings_are_read_back(tmp_path, quality, subsampling, name):
    folder = tmp_path / "set" / "train" / "cat"
    folder.mkdir(parents=True)
    (folder / "0001.jpg").write_bytes(_jpeg(quality, subsampling))
    assert jpeg_encoding(tmp_path / "set") == JpegEncoding(quality, name)


def test_a_table_no_ijg_quality_gives_has_no_quality(tmp_path):
    table = list(range(1, 65))                      # not a scaling of Table K.1
    assert ijg_quality(table) is None
    path = tmp_path / "set.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("train/cat/a.jpg", _jpeg(qtables=[table, table]))
    assert jpeg_encoding(path) == JpegEncoding(None, "4:2:0")


def test_no_jpeg_files_no_encoding(tmp_path):
    folder = tmp_path / "set" / "train" / "cat"
    folder.mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(folder / "a.png")
    assert jpeg_encoding(tmp_path / "set") is None


def test_description_names_the_colour_resolution():
    assert describe_jpeg(JpegEncoding(75, "4:2:0"), (32, 32)) == \
        "JPEG quality 75 with 4:2:0 chroma subsampling (colour stored at 16x16)"
    assert describe_jpeg(JpegEncoding(75, "4:2:2"), (32, 32)).endswith("(colour stored at 32x16)")
    assert describe_jpeg(JpegEncoding(75, "4:2:0")).endswith("(colour at half the resolution along both axes)")
    assert describe_jpeg(JpegEncoding(None, "4:4:4"), (32, 32)) == \
        "JPEG (a non-IJG table) with 4:4:4 chroma subsampling"


def test_a_reports_data_line_names_the_encoding_of_the_file_at_hand(tmp_path):
    from attncnn.reproduce.reporting.report import data_line

    path = tmp_path / "copy.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("train/cat/a.jpg", _jpeg(75, 2))
    assert data_line("copy.zip (sha256:0123456789ab)", str(path)) == (
        "Data: copy.zip (sha256:0123456789ab), stored as JPEG quality 75 with 4:2:0 chroma subsampling (colour at "
        "half the resolution along both axes): accuracies on it are not those on the original images.")
    # another file, or none at hand: the name alone, never a guess
    assert data_line("other.zip (sha256:0123456789ab)", str(path)) == "Data: other.zip (sha256:0123456789ab)."
    assert data_line("copy.zip (sha256:0123456789ab)", None) == "Data: copy.zip (sha256:0123456789ab)."
    assert data_line(None, str(path)) == "Data: none finished yet."


@pytest.mark.slow
def test_the_shared_cifar10_copy_is_quality_75_with_420(cifar10_path, data_cache_dir):
    assert jpeg_encoding(cifar10_path) == JpegEncoding(75, "4:2:0")
    ds = load_dataset(cifar10_path, data_dir=data_cache_dir)          # the session's decoded copy
    assert "(CIFAR-10 JPEG mirror; JPEG quality 75 with 4:2:0 chroma subsampling (colour stored at 16x16)" in ds.source
