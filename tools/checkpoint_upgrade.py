"""``python tools/checkpoint_upgrade.py CHECKPOINT...``: checkpoints written before checkpoints covered
their metadata, re-saved with the header digest (:func:`add_header_digest`), so that what is read
beside their tensors is checked from then on.

The file format and both digests are :mod:`attncnn.runs.checkpoint`'s; this module only rewrites a
file through its writer and checks that nothing but the new digest changed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from pathlib import Path

from attncnn._io import atomic_path
from attncnn.runs.checkpoint import CheckpointError, _read_header, load_checkpoint, write_checkpoint

__all__ = ["add_header_digest"]

log = logging.getLogger(__name__)


def add_header_digest(path: str | os.PathLike[str]) -> bool:
    """Re-save a checkpoint written before checkpoints covered their metadata with the header
    digest, so that what is read beside its tensors (epoch, step, recipe, optimiser settings) is
    checked from then on. The file is rewritten atomically by :func:`write_checkpoint`; every
    tensor keeps its name, dtype, shape and bytes, and every metadata entry its text (both checked
    on the written file before this returns). A file that already has the digest is left alone.

    Returns:
        True where the file was rewritten, False where it had the header digest already.

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: as :func:`load_checkpoint` (a file whose tensors no longer match their
            digest is refused: re-saving would vouch for changed weights), also for a file without
            the tensor digest (nothing shows its tensors are the ones written), or where the
            rewritten file would differ (then the original is put back).
    """
    path = Path(path)
    header, start = _read_header(path)
    meta = dict(header.get("__metadata__") or {})
    if "header_digest" in meta:
        return False
    if "digest" not in meta:
        raise CheckpointError(f"{path} has no content digest: nothing shows that its tensors are the ones written, "
                              "so no digest is added; save the weights again with save_checkpoint if you trust them")
    original = path.read_bytes()
    before = load_checkpoint(path)
    write_checkpoint(path, before)
    try:
        _same_contents(path, header, original[start:], meta)
    except CheckpointError:
        with atomic_path(path, suffix=".safetensors") as tmp:
            tmp.write_bytes(original)
        raise
    log.info("%s: re-saved with the header digest (tensors and metadata unchanged)", path)
    return True


def _same_contents(path: Path, header: dict, data: bytes, meta: dict) -> None:
    """Refuse a rewritten ``path`` whose tensors (name, dtype, shape, bytes) or metadata entries
    differ from the ``header`` and tensor ``data`` of the file it replaced (``meta``: its metadata)."""
    new_header, new_start = _read_header(path)
    new_data = path.read_bytes()[new_start:]

    def tensors(head: dict, raw: bytes) -> dict:
        return {name: (info["dtype"], list(info["shape"]),
                       hashlib.sha256(raw[int(info["data_offsets"][0]):int(info["data_offsets"][1])]).digest())
                for name, info in head.items() if name != "__metadata__"}

    new_meta = {k: v for k, v in new_header["__metadata__"].items() if k != "header_digest"}
    if tensors(new_header, new_data) != tensors(header, data) or new_meta != meta:
        raise CheckpointError(f"{path}: re-saving it would change its tensors or metadata; the file is left as it "
                              "was")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {'re-saved with the header digest' if add_header_digest(name) else 'has it already'}")
