"""The table of attention kinds the reference code has, and how each one's weights map to ours.

The reference's ``BertImage`` (epfml/attention-cnn at 9ffaa30, ``models/transformer.py`` and
``models/bert.py``) chooses each layer's attention with three ``config.yaml`` flags:
``use_gaussian_attention`` (``GaussianSelfAttention``; ``attention_isotropic_gaussian``: one spread
per head or a 2x2 matrix), ``use_learned_2d_encoding`` (``Learned2DRelativeSelfAttention``;
``use_attention_data`` adds content scores: our ``learned-content-9ffaa``) and neither
(``BertSelfAttention``): five kinds, one :class:`ReferenceKind` each in :data:`REFERENCE_KINDS`.

Names below are relative to a layer: ours under ``blocks.{i}.attention.``, the reference's under
``encoder.layer.{i}.attention.self.``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import InputError

__all__ = ["ReferenceKind", "REFERENCE_KINDS", "kind_of_flags", "FLAG_KEYS"]

#: the reference configuration keys that choose a layer's attention
FLAG_KEYS = ("use_gaussian_attention", "attention_isotropic_gaussian", "use_learned_2d_encoding", "use_attention_data")

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ReferenceKind:
    """How one reference attention kind maps to one of ours.

    Attributes:
        kind: our attention kind (``attncnn.layers.ATTENTION_KINDS``).
        preset: our preset a converted run names (its recipe's ``preset``; the model options
            written beside it make the network exact).
        flags: values of :data:`FLAG_KEYS` that select this kind in the reference (keys left out
            do not matter for it).
        renames: ``(our name, reference name)`` of the layer tensors copied as they are.
        heads_tensor: the reference tensor whose first dimension is the layer's head count, or None
            when the shapes do not tell it (plain content attention: ``D x D`` maps for any count).
        to_ours: extra work on the way in: ``(reference attention tensors, our layer tensors, heads,
            dim) -> None``, filling what ``renames`` does not (None: nothing).
        to_reference: the same on the way out: ``(our block tensors, reference layer tensors) -> None``,
            our block's tensors relative to ``blocks.{i}.`` and the reference's to ``encoder.layer.{i}.``.
        options: our model options for a reference configuration (``ref -> dict``), beyond the
            sizes every kind shares.
        reference_values: the reverse: reference configuration values for our model configuration.
        extra_buffers: reference buffers its ``state_dict`` holds for this kind, for our model
            configuration (``config -> {name: tensor}``), written on the way out and checked on the way in.
    """

    kind: str
    preset: str
    flags: dict
    renames: tuple[tuple[str, str], ...]
    heads_tensor: str | None
    options: Callable[[dict], dict] = field(default=lambda ref: {})
    reference_values: Callable[[object], dict] = field(default=lambda config: {})
    to_ours: Callable | None = None
    to_reference: Callable | None = None
    extra_buffers: Callable[[object], Tensors] = field(default=lambda config: {})


_VALUE = (("value.weight", "value.weight"), ("value.bias", "value.bias"))


def _gaussian_options(ref: dict) -> dict:
    return {"center_init_std": float(ref["gaussian_init_mu_std"]),
            "spread_init_std": float(ref["gaussian_init_sigma_std"])}


def _gaussian_values(config) -> dict:
    return {"gaussian_init_mu_std": config.center_init_std, "gaussian_init_sigma_std": config.spread_init_std}


def _gaussian(kind: str, isotropic: bool) -> ReferenceKind:
    # Centers and spreads copy as they are: the reference's shift delta = key - query has component
    # 0 along dim 1 of its (B, H, W, D) grid, the image rows, as ours; its Sigma^-1 = S S^T as ours,
    # and its isotropic score -s^2/2 |delta - Delta|^2 is ours with alpha = s^2/2.
    return ReferenceKind(
        kind=kind, preset=kind,
        flags={"use_gaussian_attention": True, "use_learned_2d_encoding": False,
               "attention_isotropic_gaussian": isotropic},
        renames=(("centers", "attention_centers"), ("spreads", "attention_spreads")) + _VALUE,
        heads_tensor="attention_centers", options=_gaussian_options, reference_values=_gaussian_values)


def _relative_indices(size: int) -> torch.Tensor:
    """The reference's ``relative_indices`` buffer: ``[i, j] = j - i + size - 1``, ``(size, size)`` int64."""
    idx = torch.arange(size)
    return idx[None, :] - idx[:, None] + (size - 1)


def _learned_options(ref: dict) -> dict:
    width = int(ref["position_encoding_size"])
    return {"max_size": int(ref["max_position_embeddings"]),
            "table_dim": None if width in (-1, int(ref["hidden_size"])) else width}


def _learned_values(config) -> dict:
    return {"max_position_embeddings": config.max_size,
            "position_encoding_size": -1 if config.table_dim in (None, config.dim) else config.table_dim}


def _learned_buffers(config) -> Tensors:
    return {"relative_indices": _relative_indices(config.max_size)}


#: The reference's ``row_*`` tensors score the shift along image columns and its ``col_*`` along
#: rows; ours name the axis they score. The tables' rows (shift ``d`` at row ``d + M - 1``) copy
#: row for row with ``max_size = M``.
LEARNED_RENAMES = (("row_embeddings.weight", "col_embeddings.weight"),
                   ("col_embeddings.weight", "row_embeddings.weight"),
                   ("head_keys_row.weight", "head_keys_col.weight"),
                   ("head_keys_col.weight", "head_keys_row.weight"))
#: query and key maps, ``D -> N_h D_h`` with bias, head-major on both sides (head h's coordinates
#: ``h D_h .. (h + 1) D_h - 1``), so they copy as they are
_QUERY_KEY = tuple((f"{m}.{p}", f"{m}.{p}") for m in ("query", "key") for p in ("weight", "bias"))


def _content_in(ref: Tensors, ours: Tensors, heads: int, dim: int) -> None:
    """BertSelfAttention projects values before the mix (``self.value``) and has no map after it but
    ``attention.output.dense``: ours holds the projection in ``value_in`` and an identity ``value``;
    with one head, the projection goes after the mix (the same output, as rows sum to 1)."""
    weight, bias = ref["value.weight"], ref["value.bias"]
    if heads == 1:
        ours["value.weight"], ours["value.bias"] = weight, bias
        return
    ours["value_in.weight"], ours["value_in.bias"] = weight, bias
    ours["value.weight"] = torch.eye(dim, dtype=weight.dtype)
    ours["value.bias"] = torch.zeros(dim, dtype=bias.dtype)


def _content_out(block: Tensors, ref: Tensors) -> None:
    """The way back: ``value_in`` -> ``self.value``; our ``value`` folded into the output map
    (``W_out W_val``, ``W_out b_val + b_out``: exact, bit for bit, for the identity a conversion
    wrote; otherwise computed in float64 and rounded once)."""
    projection = "value_in" if "attention.value_in.weight" in block else "value"    # one head: `value`
    for p in ("weight", "bias"):
        ref[f"attention.self.value.{p}"] = block[f"attention.{projection}.{p}"]
    if projection == "value":
        return
    w_val, b_val = block["attention.value.weight"], block["attention.value.bias"]
    w_out, b_out = block["attn_out.weight"], block["attn_out.bias"]
    if torch.equal(w_val, torch.eye(w_val.shape[0], dtype=w_val.dtype)) and not b_val.any():
        return
    dtype = w_out.dtype
    ref["attention.output.dense.weight"] = (w_out.double() @ w_val.double()).to(dtype)
    ref["attention.output.dense.bias"] = (w_out.double() @ b_val.double() + b_out.double()).to(dtype)


def _content_options(ref: dict) -> dict:
    dim, heads = int(ref["hidden_size"]), int(ref["num_attention_heads"])
    if dim % heads:
        raise InputError(f"plain content attention needs hidden_size divisible by num_attention_heads (the "
                         f"reference's BertSelfAttention refuses it too), got {dim} and {heads}")
    # "content" is not a preset: the recipe names the paper's preset with attention=content
    return {"attention": "content", "head_dim": None if heads == 1 else dim // heads}


def _content_values(config) -> dict:
    width = config.head_dim or config.dim
    if width * config.num_heads != config.dim:
        raise InputError(f"the reference's content attention splits the width over the heads (head_dim = D / N_h "
                         f"= {config.dim} / {config.num_heads}), but this model has head_dim={config.head_dim}")
    return {}


REFERENCE_KINDS: tuple[ReferenceKind, ...] = (
    _gaussian("quadratic", isotropic=True),
    _gaussian("quadratic-generalized", isotropic=False),
    ReferenceKind(
        kind="learned", preset="learned",
        flags={"use_gaussian_attention": False, "use_learned_2d_encoding": True, "use_attention_data": False},
        renames=LEARNED_RENAMES + _VALUE, heads_tensor="head_keys_row.weight",
        options=_learned_options, reference_values=_learned_values, extra_buffers=_learned_buffers),
    # Learned2DRelativeSelfAttention with use_attention_data: the learned tables as above (the same
    # swap, the same relative_indices buffer) and query/key maps D -> N_h D with heads as wide as
    # the model; both score w_row.e_row + w_col.e_col + q.k / sqrt(D), softmax over every key
    ReferenceKind(
        kind="learned-content-9ffaa", preset="learned-content-9ffaa",
        flags={"use_gaussian_attention": False, "use_learned_2d_encoding": True, "use_attention_data": True},
        renames=LEARNED_RENAMES + _QUERY_KEY + _VALUE, heads_tensor="head_keys_row.weight",
        options=_learned_options, reference_values=_learned_values, extra_buffers=_learned_buffers),
    ReferenceKind(
        kind="content", preset="quadratic",
        flags={"use_gaussian_attention": False, "use_learned_2d_encoding": False},
        renames=_QUERY_KEY, heads_tensor=None, options=_content_options, reference_values=_content_values,
        to_ours=_content_in, to_reference=_content_out),
)


def kind_of_flags(flags: dict) -> ReferenceKind:
    """The entry whose ``flags`` the reference configuration ``flags`` (all of :data:`FLAG_KEYS`) has.

    Raises:
        InputError: both Gaussian and learned attention (the reference refuses it too).
    """
    if flags["use_gaussian_attention"] and flags["use_learned_2d_encoding"]:
        raise InputError("the configuration sets both use_gaussian_attention and use_learned_2d_encoding, which the "
                         "reference's BertAttention refuses; set one of them")
    for entry in REFERENCE_KINDS:
        if all(bool(flags[k]) == v for k, v in entry.flags.items()):
            return entry
    raise InputError(f"no attention kind of attncnn matches the reference flags {flags}")
