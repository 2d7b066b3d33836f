"""Tensor names between the reference's ``BertImage`` and our :class:`~attncnn.models.ImageTransformer`.

Both are the same network (post-LN blocks, the stem's features ordered (dy, dx, c) on both sides,
mean pooling, a linear head), so most tensors
copy under another name:

=====================================================  ==========================================
reference (``model_state_dict``)                       ours (``ImageTransformer.state_dict()``)
=====================================================  ==========================================
``features_upscale.{weight,bias}``                     ``embed.{weight,bias}``
``classifier.{weight,bias}``                           ``head.{weight,bias}``
``encoder.layer.i.attention.output.dense``             ``blocks.i.attn_out``
``encoder.layer.i.attention.output.LayerNorm``         ``blocks.i.norm1``
``encoder.layer.i.intermediate.dense``                 ``blocks.i.fc1``
``encoder.layer.i.output.dense``                       ``blocks.i.fc2``
``encoder.layer.i.output.LayerNorm``                   ``blocks.i.norm2``
``encoder.layer.i.attention.self.*``                   ``blocks.i.attention.*`` (per kind: :mod:`.kinds`)
=====================================================  ==========================================

The reference's buffers (``attention_mask``, a scalar 1.0 added to content scores, which the softmax
ignores; ``relative_indices``) carry nothing ours needs; its Gaussian layers' ``R`` is not in its
checkpoints (``store_checkpoint`` drops every key containing ``self.R``). On the way out they are
written as its ``state_dict`` holds them.
"""

from __future__ import annotations

import torch

from ..errors import InputError
from .config import LAYER_PREFIX
from .kinds import ReferenceKind

__all__ = ["TOP_RENAMES", "BLOCK_RENAMES", "to_ours", "to_reference"]

#: (ours, reference) outside the blocks
TOP_RENAMES = tuple((f"{o}.{p}", f"{r}.{p}") for o, r in (("embed", "features_upscale"), ("head", "classifier"))
                    for p in ("weight", "bias"))
#: (ours under blocks.{i}., reference under encoder.layer.{i}.) around the attention
BLOCK_RENAMES = tuple((f"{o}.{p}", f"{r}.{p}") for o, r in (
    ("attn_out", "attention.output.dense"), ("norm1", "attention.output.LayerNorm"),
    ("fc1", "intermediate.dense"), ("fc2", "output.dense"), ("norm2", "output.LayerNorm")) for p in ("weight", "bias"))
_SELF = "attention.self."


class _Reads(dict):
    """A dict that remembers which keys were read (so that leftovers can be named)."""

    def __init__(self, values: dict) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def __getitem__(self, key: str):
        if key not in self:
            raise InputError(f"the checkpoint has no {key} tensor, which this model needs; the file is incomplete or "
                             "its configuration is not this run's")
        self.read.add(key)
        return super().__getitem__(key)


def _ignored(name: str) -> bool:
    """Reference buffers that carry no weight: the mask scalar, the Gaussian grids, the index tables."""
    return name == "attention_mask" or name.endswith(".attention.self.R") or name.endswith(".relative_indices")


def to_ours(state: dict, entry: ReferenceKind, heads: list[int], dim: int) -> dict[str, torch.Tensor]:
    """Our ``ImageTransformer`` state dict for the reference ``model_state_dict`` ``state`` (no
    ``module.`` prefix) of attention kind ``entry`` with ``heads[i]`` heads in layer ``i``.

    Raises:
        InputError: a tensor missing, or tensors left over that this kind does not have (named).
    """
    source = _Reads(state)
    ours = {o: source[r] for o, r in TOP_RENAMES}
    for i, count in enumerate(heads):
        ref, block = LAYER_PREFIX.format(i), f"blocks.{i}."
        ours.update({block + o: source[ref + r] for o, r in BLOCK_RENAMES})
        ours.update({f"{block}attention.{o}": source[ref + _SELF + r] for o, r in entry.renames})
        if entry.to_ours is not None:
            mine = _Reads({k[len(ref + _SELF):]: v for k, v in state.items() if k.startswith(ref + _SELF)})
            attention: dict = {}
            entry.to_ours(mine, attention, count, dim)
            source.read |= {ref + _SELF + k for k in mine.read}
            ours.update({f"{block}attention.{k}": v for k, v in attention.items()})
    left = sorted(k for k in set(state) - source.read if not _ignored(k))
    if left:
        shown = ", ".join(left[:6]) + (f" and {len(left) - 6} more" if len(left) > 6 else "")
        raise InputError(f"the checkpoint holds tensors that a reference {entry.kind} model of {len(heads)} layers "
                         f"does not have: {shown}; is the configuration this run's?")
    return ours


def to_reference(ours: dict, entry: ReferenceKind, config) -> dict[str, torch.Tensor]:
    """The reference ``model_state_dict`` for our state dict ``ours`` of a network with configuration
    ``config``, with the buffers the reference's ``state_dict`` holds and without those its
    ``store_checkpoint`` drops."""
    ref: dict[str, torch.Tensor] = {"attention_mask": torch.tensor(1.0)}
    ref.update({r: ours[o] for o, r in TOP_RENAMES[:2]})
    for i in range(config.num_layers):
        prefix, block = LAYER_PREFIX.format(i), f"blocks.{i}."
        layer = {_SELF + name: tensor for name, tensor in entry.extra_buffers(config).items()}
        layer.update({_SELF + r: ours[f"{block}attention.{o}"] for o, r in entry.renames})
        layer.update({r: ours[block + o] for o, r in BLOCK_RENAMES})
        if entry.to_reference is not None:
            entry.to_reference({k[len(block):]: v for k, v in ours.items() if k.startswith(block)}, layer)
        ref.update({prefix + k: v for k, v in layer.items()})
    ref.update({r: ours[o] for o, r in TOP_RENAMES[2:]})
    return ref
