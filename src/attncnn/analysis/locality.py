"""How local each head's attention is: mean attention distance and normalised entropy, per layer and head.

Both are taken from each layer's *real input* through the forward hooks of :mod:`.maps`, averaged
over the queries of the token grid (border queries included, as in ViT and ConViT) and the images:

* **mean attention distance** (Dosovitskiy et al., ICLR 2021, Fig. 7 and appendix D.7): for query
  ``q``, ``sum_k p(q, k) * |pos(k) - pos(q)|_2``. In tokens (one token is ``pooling`` image pixels;
  ViT gives pixels) and normalised by the grid side, ``distance / sqrt(H * W)``, as a fraction of
  the image side (Santiago Toledo & Martínez, arXiv 2605.16390, 2026; the geometric mean is our
  choice for non-square grids).
* **normalised entropy** (the same paper's second measure): for query ``q``,
  ``-sum_k p(q, k) log p(q, k) / log(H*W)``: 0 for a one-hot head, 1 for a uniform one.

For the margin-restricted variant see :func:`~attncnn.analysis.metrics.head_statistics`.
Position-only layers are measured once from ``layer.grid_probs(H, W)``, without images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from ..errors import InputError
from ..layers import GridAttention, relative_offsets
from .maps import default_grid_size, measured_layers, run_recorded

__all__ = ["DEFAULT_LOCALITY_IMAGES", "LOCAL_HEAD_DISTANCE", "LayerLocality", "Locality", "grid_side",
           "head_locality", "model_locality"]

#: Test images the locality measures average over by default.
DEFAULT_LOCALITY_IMAGES = 1000
#: A head whose mean attention distance is at most this many tokens stays, on average, within the
#: reach of a 3x3 convolution (its farthest shift, a diagonal neighbour, is sqrt(2) = 1.41 tokens away).
LOCAL_HEAD_DISTANCE = 1.5


def grid_side(height: int, width: int) -> float:
    """The side of an ``H x W`` token grid that distances are normalised by: ``sqrt(H * W)``
    (``H`` for a square grid; see the module docstring)."""
    return math.sqrt(height * width)


def batched_probs(probs: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``probs`` as ``(B, N_h, Q, H*W)``: ``(N_h, Q, H*W)`` gains a batch of one.

    Raises:
        InputError: another rank, or a last dimension that is not the ``H*W`` keys of the grid.
    """
    if probs.dim() == 3:
        probs = probs.unsqueeze(0)
    n = height * width
    if probs.dim() != 4 or probs.shape[-1] != n:
        raise InputError(f"expected probabilities (B, N_h, Q, {n}) for a {height}x{width} grid, "
                         f"got {tuple(probs.shape)}")
    return probs


def _sums(probs: torch.Tensor, height: int, width: int,
          queries: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per-head sums over batch and queries of the distance (tokens) and the entropy (nats),
    float64 ``(N_h,)`` each, and the number of (image, query) pairs summed."""
    probs = batched_probs(probs, height, width)
    if height * width < 2:
        raise InputError("a 1x1 token grid has a single key: attention distance and entropy are not defined")
    expected = height * width if queries is None else len(queries)
    if probs.shape[-2] != expected:
        raise InputError(f"probabilities hold {probs.shape[-2]} queries, expected {expected}")
    offsets = relative_offsets(height, width, device=probs.device, dtype=torch.float32)
    if queries is not None:
        offsets = offsets[torch.as_tensor(list(queries), dtype=torch.long, device=probs.device)]
    dist = offsets.norm(dim=-1)                                              # (Q, N), tokens
    p = probs.float()
    distance = torch.einsum("bhqk,qk->bhq", p, dist).double().sum(dim=(0, 2))
    entropy = -torch.special.xlogy(p, p).sum(-1).double().sum(dim=(0, 2))
    return distance.cpu(), entropy.cpu(), probs.shape[0] * probs.shape[-2]


def head_locality(probs: torch.Tensor, height: int, width: int, *,
                  queries: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """Mean attention distance and normalised entropy of each head of one layer's probabilities.

    Args:
        probs: ``(B, N_h, Q, H*W)`` or ``(N_h, Q, H*W)`` attention probabilities (queries on
            dim -2, keys on dim -1, tokens row-major; each row sums to 1 over the keys);
            ``Q = H*W`` unless ``queries`` names the kept queries.
        height, width: the token grid.
        queries: row-major indices of the ``Q`` queries in ``probs`` (default all, in order).

    Returns:
        ``{"distance": tokens, "normalized_distance": distance / sqrt(H*W), "normalized_entropy":
        entropy / log(H*W)}``, each float64 ``(N_h,)`` on the CPU, averaged over the batch and the
        queries (definitions and sources in the module docstring).

    Raises:
        InputError: a shape that does not fit the grid, or a 1x1 grid.
    """
    return _means(*_sums(probs, height, width, queries), height, width)


def _means(distance: torch.Tensor, entropy: torch.Tensor, count: int, height: int,
           width: int) -> dict[str, torch.Tensor]:
    distance = distance / count
    return {"distance": distance, "normalized_distance": distance / grid_side(height, width),
            "normalized_entropy": entropy / count / math.log(height * width)}


@dataclass
class LayerLocality:
    """Locality of one layer's heads (module docstring: definitions and sources).

    Attributes:
        layer: 0-based index of the block.
        kind: the layer's attention kind (``"quadratic"``, ``"learned-content"``, ...).
        distance: ``(N_h,)`` mean attention distance of each head, in tokens (float64, CPU).
        normalized_distance: ``(N_h,)`` the same divided by the grid side ``sqrt(H*W)``.
        normalized_entropy: ``(N_h,)`` mean entropy over ``log(H*W)``: 0 one-hot, 1 uniform.
        height, width: the token grid the layer saw.
        position_only: True when the layer's maps do not depend on the input (measured once, no images).
    """

    layer: int
    kind: str
    distance: torch.Tensor
    normalized_distance: torch.Tensor
    normalized_entropy: torch.Tensor
    height: int
    width: int
    position_only: bool

    def local_heads(self, threshold: float = LOCAL_HEAD_DISTANCE) -> int:
        """How many heads have a mean attention distance of at most ``threshold`` tokens."""
        return int((self.distance <= threshold).sum())

    def to_dict(self) -> dict:
        """JSON-ready: ``layer`` 1-based (as ``attncnn inspect``), per-head lists, head means and minima."""
        return {"layer": self.layer + 1, "kind": self.kind, "position_only": self.position_only,
                "num_heads": len(self.distance), "distance": float(self.distance.mean()),
                "min_distance": float(self.distance.min()),
                "normalized_distance": float(self.normalized_distance.mean()),
                "normalized_entropy": float(self.normalized_entropy.mean()),
                "local_heads": self.local_heads(),
                "heads": [{"head": h + 1, "distance": float(d), "normalized_distance": float(nd),
                           "normalized_entropy": float(e)}
                          for h, (d, nd, e) in enumerate(zip(self.distance, self.normalized_distance,
                                                             self.normalized_entropy))]}


@dataclass
class Locality:
    """Locality of every layer of a model: what :func:`model_locality` and :func:`attncnn.locality` return.

    Attributes:
        layers: one :class:`LayerLocality` per block, first block first.
        images: test images the input-dependent layers were averaged over; 0 when every layer is
            position-only (measured without images).
        grid: the token grid ``(H, W)``.
    """

    layers: list[LayerLocality]
    images: int
    grid: tuple[int, int]

    @property
    def side(self) -> float:
        """The grid side distances are normalised by, ``sqrt(H * W)`` tokens."""
        return grid_side(*self.grid)

    def min_distance(self) -> dict:
        """The most local head of the model: ``{"distance": tokens, "normalized_distance",
        "layer": 1-based, "head": 1-based}`` (arXiv 2605.16390's "minimum mean attention distance")."""
        best = min(((float(lay.distance[h]), lay.layer, h) for lay in self.layers
                    for h in range(len(lay.distance))))
        return {"distance": best[0], "normalized_distance": best[0] / self.side, "layer": best[1] + 1,
                "head": best[2] + 1}

    def to_dict(self) -> dict:
        """JSON-ready: ``grid``, ``side``, ``images``, ``min_distance`` and ``layers`` (each
        :meth:`LayerLocality.to_dict`)."""
        return {"grid": list(self.grid), "side": self.side, "images": self.images,
                "min_distance": self.min_distance(), "layers": [lay.to_dict() for lay in self.layers]}

    @classmethod
    def from_dict(cls, data: dict) -> "Locality":
        """The inverse of :meth:`to_dict` (e.g. a report's ``locality`` entry read back).

        Raises:
            KeyError: a dictionary without the keys :meth:`to_dict` writes.
        """
        h, w = data["grid"]

        def heads(layer: dict, key: str) -> torch.Tensor:
            return torch.tensor([head[key] for head in layer["heads"]], dtype=torch.float64)

        layers = [LayerLocality(lay["layer"] - 1, lay["kind"], heads(lay, "distance"),
                                heads(lay, "normalized_distance"), heads(lay, "normalized_entropy"), h, w,
                                lay["position_only"]) for lay in data["layers"]]
        return cls(layers, data["images"], (h, w))


def _layer_locality(index: int, layer: GridAttention, stats: dict[str, torch.Tensor], height: int,
                    width: int) -> LayerLocality:
    return LayerLocality(index, layer.kind, stats["distance"], stats["normalized_distance"],
                         stats["normalized_entropy"], height, width, layer.position_only)


@torch.no_grad()
def model_locality(model: nn.Module, images: torch.Tensor | None = None, *,
                   grid_size: tuple[int, int] | None = None, batch_size: int = 50) -> Locality:
    """Mean attention distance and normalised entropy of every head of an image transformer.

    Args:
        model: an :class:`~attncnn.models.ImageTransformer` (eval mode during the call, then restored).
        images: normalised images ``(B, C, H_img, W_img)``, averaged over batch by batch from each
            layer's real input; None: every layer must be position-only.
        grid_size: token grid ``(H, W)`` without images (default that of 32 x 32 images).
        batch_size: images per forward pass.

    Returns:
        A :class:`Locality`; its ``images`` is ``B`` where a layer depends on the input, else 0.

    Raises:
        InputError: no attention blocks, an input-dependent model without images, empty images,
            or a 1x1 token grid.
    """
    layers, position_only = measured_layers(model, images, "its locality needs test images")
    if images is None:
        h, w = grid_size or default_grid_size(model)
        out = [_layer_locality(i, layer, head_locality(layer.grid_probs(h, w), h, w), h, w)
               for i, layer in enumerate(layers)]
        return Locality(out, 0, (h, w))
    sums: dict[int, list] = {}
    grids: dict[int, tuple[int, int]] = {}

    def callback(index: int, layer: GridAttention, x: torch.Tensor) -> None:
        hh, ww = x.shape[1], x.shape[2]
        grids[index] = (hh, ww)
        if layer.position_only:
            if index not in sums:                       # the same for every image: once
                sums[index] = list(_sums(layer.grid_probs(hh, ww), hh, ww))
            return
        new = _sums(layer.input_probs(x), hh, ww)
        sums[index] = [total + part for total, part in zip(sums[index], new)] if index in sums else list(new)

    run_recorded(model, images, callback, batch_size)
    out = [_layer_locality(i, layer, _means(*sums[i], *grids[i]), *grids[i]) for i, layer in enumerate(layers)]
    return Locality(out, 0 if position_only else int(images.shape[0]), grids[0])
