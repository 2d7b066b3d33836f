"""Checkpoints written before the header digest: said once per file, re-saved with it byte for byte,
and none of them shipped any more."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import pytest
import safetensors.torch
import torch
from checkpoint_upgrade import add_header_digest

from attncnn.runs.checkpoint import CheckpointError, Checkpoint, load_checkpoint, read_metadata, write_checkpoint

REPO = Path(__file__).resolve().parents[2]
LOGGER = "attncnn.runs.checkpoint"          # its notes of older files


def _header(path: Path) -> tuple[dict, int]:
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + size]), 8 + size


def _tensor_bytes(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """Every tensor of the file as stored: its dtype name, shape and raw bytes."""
    header, start = _header(path)
    raw = path.read_bytes()[start:]
    return {name: (info["dtype"], info["shape"], raw[info["data_offsets"][0]:info["data_offsets"][1]])
            for name, info in header.items() if name != "__metadata__"}


def _older(tmp_path: Path, name: str = "old.safetensors", *, keep_digest: bool = True) -> Path:
    """A checkpoint as attncnn wrote it before the header digest: bf16 and float32 weights, an
    optimiser's state, an RNG state, metadata; the tensor digest kept unless told otherwise."""
    path = tmp_path / name
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to(torch.bfloat16)
    model[1].float()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model[1](model[0](torch.randn(2, 3, dtype=torch.bfloat16)).float()).sum().backward()
    opt.step()
    write_checkpoint(path, Checkpoint(model_state=model.state_dict(), optimizer_state=opt.state_dict(),
                                      extra_tensors={"rng": torch.arange(7, dtype=torch.uint8)},
                                      metadata={"epoch": 3, "step_in_epoch": 0, "config": {"lr": 0.1}}))
    tensors = safetensors.torch.load_file(str(path))
    meta = _header(path)[0]["__metadata__"]
    del meta["header_digest"]
    if not keep_digest:
        del meta["digest"]
    safetensors.torch.save_file(tensors, str(path), metadata=meta)
    return path


def _notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.INFO
            and ("before checkpoints covered" in r.getMessage() or "no content digest" in r.getMessage())]


@pytest.mark.parametrize("keep_digest", [True, False])
def test_an_older_file_is_spoken_of_once_per_process_however_often_it_is_read(tmp_path, caplog, keep_digest):
    # A plot of a run with six periodic checkpoints said it eight times; an export twice.
    first, second = _older(tmp_path, keep_digest=keep_digest), _older(tmp_path, "other.safetensors",
                                                                       keep_digest=keep_digest)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            load_checkpoint(first)
            read_metadata(first)
        load_checkpoint(tmp_path / "." / "old.safetensors")       # the same file by another spelling
        load_checkpoint(second)
    notes = _notes(caplog)
    assert len(notes) == 2 and notes[0].startswith(str(first)) and notes[1].startswith(str(second))
    if keep_digest:
        assert "tools/checkpoint_upgrade.py" in notes[0]


def test_adding_the_header_digest_keeps_every_tensor_byte_and_metadata_entry(tmp_path, caplog):
    path = _older(tmp_path)
    before_tensors, before_meta = _tensor_bytes(path), _header(path)[0]["__metadata__"]
    assert add_header_digest(path) is True
    after_meta = _header(path)[0]["__metadata__"]
    assert _tensor_bytes(path) == before_tensors
    assert {k: v for k, v in after_meta.items() if k != "header_digest"} == before_meta
    assert after_meta["header_digest"].startswith("sha256:")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        ck = load_checkpoint(path)
    assert _notes(caplog) == [] and ck.metadata["epoch"] == 3 and ck.optimizer_state is not None
    # the metadata is now covered: a changed step is refused
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b'\\"step_in_epoch\\": 0', b'\\"step_in_epoch\\": 7', 1))
    with pytest.raises(CheckpointError, match="its metadata .* does not match the digest"):
        load_checkpoint(path)


def test_adding_the_digest_leaves_a_sealed_file_alone_and_refuses_unchecked_or_corrupt_ones(tmp_path):
    sealed = _older(tmp_path, "sealed.safetensors")
    add_header_digest(sealed)
    raw = sealed.read_bytes()
    assert add_header_digest(sealed) is False and sealed.read_bytes() == raw
    unchecked = _older(tmp_path, "unchecked.safetensors", keep_digest=False)
    raw = unchecked.read_bytes()
    with pytest.raises(CheckpointError, match="has no content digest: nothing shows"):
        add_header_digest(unchecked)
    assert unchecked.read_bytes() == raw
    corrupt = _older(tmp_path, "corrupt.safetensors")
    data = bytearray(corrupt.read_bytes())
    data[-1] ^= 1
    corrupt.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="its tensors do not match the digest"):
        add_header_digest(corrupt)
    assert corrupt.read_bytes() == bytes(data)


SHIPPED = sorted(p for folder in (REPO / "results", REPO / "src" / "attncnn" / "pretrained_models")
                 for p in folder.rglob("*.safetensors"))


@pytest.mark.skipif(not SHIPPED, reason="no committed checkpoints")
def test_every_shipped_checkpoint_covers_its_metadata():
    # Each used to say "written before checkpoints covered their metadata" on every use.
    missing = [str(p.relative_to(REPO)) for p in SHIPPED if "header_digest" not in _header(p)[0]["__metadata__"]]
    assert missing == []
