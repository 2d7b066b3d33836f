"""Export an image transformer's attention (or a run's) into the viewer's manifest and blobs.

Maps come from each layer's real input, every kind the page needs in one pass
(:func:`~attncnn.analysis.maps.attention_maps_by_kind`). What each set holds:

* position-only models: one set for every image, ``probs`` (scaled8) and ``scores`` (affine8);
* content models, per test image: ``content`` (q.k/sqrt(D_h), affine8) and, with learned relative
  encodings, ``positional`` (q.r/sqrt(D_h), separable8); the page recomputes the probabilities as
  ``softmax(content + positional)``, so a score error of at most ``e`` per key bounds the
  probability error by ``p * (exp(2 e) - 1)``. The batch average also stores the averaged
  ``probs`` (an average of softmaxes is not the softmax of averaged scores).

Every set also holds ``rollout`` (scaled8; :mod:`attncnn.analysis.rollout`; for the batch average,
the mean of the images' rollouts). Quadratic runs also
carry each head's center and ellipses (:mod:`.centers`); GPSA runs each head's gate.
"""

from __future__ import annotations

import base64
import logging
import os
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from ...errors import InputError
from ...layers import GridAttention
from ..maps import LayerMaps, attention_layers, attention_maps_by_kind
from ..rollout import model_rollout
from ..runs import ImageIndexError, Run, open_run, shareable_dataset, test_images
from .centers import head_centers
from .encoding import Blob, encode_affine, encode_positional, encode_scaled

__all__ = ["RunExport", "export_model", "export_run", "head_gates"]

log = logging.getLogger(__name__)

# The encoding of each map kind (module docstring); "positional" is separable8 when it can be.
_ENCODERS = {"probs": encode_scaled, "scores": encode_affine, "content": encode_affine, "rollout": encode_scaled}


@dataclass
class RunExport:
    """One run ready for the page.

    Attributes:
        manifest: JSON-ready description (run facts, images, per set the encoding of each map
            kind; blob indices are local to this run until :func:`~.page.build_html` renumbers them).
        blobs: per set, in the order of ``manifest["sets"]``: the raw (uncompressed) payload and
            its array index ``{name: {"dtype", "shape", "offset"}}``.
    """

    manifest: dict
    blobs: list[tuple[bytes, dict]] = field(default_factory=list)


def _layer_kinds(layers: Sequence[GridAttention]) -> dict[str, bool]:
    """The page's value choices (``DISPLAY_KINDS``) this model has."""
    position_only = all(layer.position_only for layer in layers)
    if not position_only and any(layer.position_only for layer in layers):
        raise InputError("the viewer needs all layers position-only or all content-based; this model mixes them")
    positional = all(layer.has_positional_term for layer in layers)
    return {"all": True, "positional": positional, "content": not position_only, "rollout": True}


def head_gates(layers: Sequence[GridAttention]) -> list[list[float] | None] | None:
    """Per layer, the gates ``sigmoid(lambda_h)`` of its heads (the positional softmax's weight in
    ConViT's mix, in [0, 1]) for GPSA layers, None for other layers; None when no layer is gated."""
    gates = [[float(g) for g in layer.gates().detach().double().cpu()] if layer.has_gates else None
             for layer in layers]
    return gates if any(g is not None for g in gates) else None


def _pixels(raw: torch.Tensor) -> str:
    """``(C, H, W)`` uint8 -> base64 of ``H x W x 3`` RGB bytes (grey images repeated)."""
    img = raw.detach().cpu().to(torch.uint8)
    if img.shape[0] == 1:
        img = img.expand(3, -1, -1)
    return base64.b64encode(img[:3].permute(1, 2, 0).contiguous().numpy().tobytes()).decode("ascii")


def _predictions(model: nn.Module, images: torch.Tensor, classes: Sequence[str] | None) -> list[dict]:
    with torch.no_grad():
        probs = torch.softmax(model(images).float(), dim=-1)
    top = probs.max(dim=-1)
    out = []
    for p, i in zip(top.values.tolist(), top.indices.tolist()):
        name = classes[i] if classes is not None and i < len(classes) else str(i)
        out.append({"class": name, "p": round(p, 4)})
    return out


def _grid(maps: Sequence[LayerMaps]) -> tuple[int, int]:
    grids = {(m.height, m.width) for m in maps}
    if len(grids) != 1:
        raise InputError(f"the layers see different token grids {sorted(grids)}; the viewer needs one grid")
    return grids.pop()


class _Sets:
    """The sets of one run under construction: their manifest entries and their blobs."""

    def __init__(self, grid: tuple[int, int], delta: bool) -> None:
        self.grid, self.delta = grid, delta
        self.sets: list[dict] = []
        self.blobs: list[tuple[bytes, dict]] = []

    def add(self, maps: dict[str, list[LayerMaps]], index: int, label: str) -> int:
        """Encode batch entry ``index`` (0 for batch-1 maps) of every kind in ``maps`` as one new set.

        Returns:
            The index of the new set.
        """
        blob, encoded = Blob(), {}
        for kind, layer_maps in maps.items():
            encoded[kind] = []
            for i, m in enumerate(layer_maps):
                values = m.probs[min(index, m.probs.shape[0] - 1)].double().numpy()      # (N_h, N, N)
                if kind == "positional":
                    encoded[kind].append(encode_positional(blob, f"{kind}.{i}", values, *self.grid, self.delta))
                else:
                    encoded[kind].append(_ENCODERS[kind](blob, f"{kind}.{i}", values, self.delta))
        self.sets.append({"blob": len(self.blobs), "maps": encoded, "label": label})
        self.blobs.append((blob.payload(), blob.arrays))
        return len(self.sets) - 1


def _check_batches(images: torch.Tensor, raw: torch.Tensor, labels: Sequence[str],
                   average_images: torch.Tensor | None, average_raw: torch.Tensor | None) -> None:
    if not images.shape[0] == raw.shape[0] == len(labels):
        raise InputError(f"give one label and one raw image per image: {images.shape[0]} images, "
                         f"{raw.shape[0]} raw images, {len(labels)} labels")
    if (average_images is None) != (average_raw is None) or (
            average_images is not None and average_images.shape[0] != average_raw.shape[0]):
        raise InputError("average_images and average_raw must be given together, with the same number of images")


def export_model(model: nn.Module, images: torch.Tensor, raw: torch.Tensor, *, labels: Sequence[str],
                 average_images: torch.Tensor | None = None, average_raw: torch.Tensor | None = None,
                 classes: Sequence[str] | None = None, batch_size: int = 50, delta: bool = True) -> RunExport:
    """Export an image transformer's attention maps for some images and, optionally, an average.

    Args:
        model: an :class:`~attncnn.models.ImageTransformer` (CPU; eval mode during the call).
        images: normalised images ``(B, C, H_img, W_img)`` shown one by one.
        raw: the same images as uint8 ``(B, C, H_img, W_img)`` (drawn under the token grid).
        labels: one label per image (e.g. ``"2"`` for test image 2).
        average_images, average_raw: a batch ``(N, C, H_img, W_img)`` whose maps are averaged
            (paper Fig. 6); None for no average. Ignored for position-only models.
        classes: class names for the predicted labels shown in the page.
        batch_size: images per forward pass.
        delta: store the uint8 rows as differences along the keys (smaller files).

    Returns:
        A :class:`RunExport`; its manifest has the maps' facts, :func:`export_run` adds the run's.

    Raises:
        InputError: no attention blocks (ResNet), layers that mix position-only and content
            attention, layers on different token grids, or batches of different lengths.
    """
    _check_batches(images, raw, labels, average_images, average_raw)
    layers = attention_layers(model)
    kinds = _layer_kinds(layers)
    position_only = not kinds["content"]
    # position-only: one set for every image (the maps do not depend on the input, whose grid is all that counts)
    shown = images[:1] if position_only else images
    map_kinds = ["probs", "scores"] if position_only else [k for k in ("content", "positional") if kinds[k]]
    maps = attention_maps_by_kind(model, shown, map_kinds, batch_size=batch_size)
    maps["rollout"] = model_rollout(model, shown, batch_size=batch_size)
    sets = _Sets(_grid(maps[map_kinds[0]]), delta)
    if position_only:
        set_of_image = [sets.add(maps, 0, "position")] * images.shape[0]
    else:
        set_of_image = [sets.add(maps, b, str(label)) for b, label in enumerate(labels)]
    entries = [{"key": str(label), "label": f"test image {label}", "set": set_of_image[b],
                "size": list(raw.shape[-2:]), "pixels": _pixels(raw[b]), "prediction": prediction}
               for b, (label, prediction) in enumerate(zip(labels, _predictions(model, images, classes)))]
    average = 0
    if average_images is not None and average_images.shape[0] and not position_only:
        average = int(average_images.shape[0])
        # the average of softmaxes is not the softmax of averaged scores: store the probabilities too
        maps = attention_maps_by_kind(model, average_images, [*map_kinds, "probs"], average=True,
                                      batch_size=batch_size)
        maps["rollout"] = model_rollout(model, average_images, average=True, batch_size=batch_size)
        mean_raw = average_raw.float().mean(0).round().to(torch.uint8)
        entries.append({"key": "average", "label": f"average of {average} test images",
                        "set": sets.add(maps, 0, "average"), "size": list(average_raw.shape[-2:]),
                        "pixels": _pixels(mean_raw)})
    manifest = {"layers": len(layers), "heads": [layer.num_heads for layer in layers], "grid": list(sets.grid),
                "position_only": position_only, "kinds": kinds, "images": entries, "sets": sets.sets,
                "average": average, "centers": head_centers(layers), "gates": head_gates(layers)}
    return RunExport(manifest, sets.blobs)


def _accuracy(run: Run) -> dict | None:
    records = [r for r in run.metrics if isinstance(r.get("test_accuracy"), (int, float))]
    if not records:
        return None
    last = records[-1]
    best = max(records, key=lambda r: r["test_accuracy"])
    return {"last": last["test_accuracy"], "last_epoch": last.get("epoch"), "best": best["test_accuracy"],
            "best_epoch": best.get("epoch")}


def _beyond_the_split(err: ImageIndexError, indices: Sequence[int], average: int) -> ImageIndexError:
    """The same error, with a message in the command's words (``--images``, ``--average``)."""
    bad = [i for i in indices if i >= err.count]
    if bad:
        message = (f"--images {','.join(map(str, bad))}: beyond the {err.count} test images of {err.source}; "
                   f"choose indices from 0 to {err.count - 1}")
    else:
        message = (f"--average {average} exceeds the {err.count} test images of {err.source}; "
                   f"choose --average {err.count} or fewer")
    return ImageIndexError(err.indices, err.count, err.source, message)


def _run_facts(run: Run, data: str | None) -> dict:
    """What the page shows about a run besides its maps. Pages get shared: no local path goes in,
    only the run's folder name and the data set's shareable name (:func:`shareable_dataset`)."""
    config = run.metadata.get("config", {}) if isinstance(run.metadata.get("config"), dict) else {}
    return {"name": run.name, "preset": config.get("preset"), "attention": run.kind,
            "epoch": run.metadata.get("epoch"), "dataset": shareable_dataset(run.metadata, data),
            "accuracy": _accuracy(run), "parameters": int(sum(p.numel() for p in run.model.parameters()))}


def export_run(run: Run | str | os.PathLike, indices: Sequence[int], *, data: str | None = None,
               data_dir: str | None = None, average: int = 100, batch_size: int = 50,
               delta: bool = True) -> RunExport:
    """Export a run (folder or checkpoint) for the viewer: test images ``indices`` and the average
    over the first ``average`` test images (content models; 0 for none).

    Raises:
        FileNotFoundError: no run at the path.
        InputError: a ResNet run (no attention), ``average < 0``, no indices.
        attncnn.analysis.runs.ImageIndexError: an image index or ``average`` beyond the test split
            (a ValueError; the message gives the split's size).
        attncnn.data.DataError: the run's data set cannot be found (pass ``data``).
    """
    if not isinstance(run, Run):
        run = open_run(run)
    indices = list(dict.fromkeys(indices))           # "2,2" shows image 2 once
    if not indices:
        raise InputError("give at least one test image index (e.g. --images 2,3,19,56)")
    if average < 0:
        raise InputError(f"--average must be >= 0 test images, got {average}")
    try:
        layers = attention_layers(run.model)
    except ValueError as err:
        raise InputError(f"{run.path}: {err}; pass runs of the quadratic, learned or content presets") from None
    needs_average = average > 0 and not all(layer.position_only for layer in layers)
    wanted = list(indices) + (list(range(average)) if needs_average else [])
    try:
        normalised, raw = test_images(run, wanted, data=data, data_dir=data_dir)
    except ImageIndexError as err:
        raise _beyond_the_split(err, indices, average if needs_average else 0) from None
    k = len(indices)
    log.info("viewer: %s: %d image(s)%s", run.name, k, f" + average of {average}" if needs_average else "")
    export = export_model(run.model, normalised[:k], raw[:k], labels=[str(i) for i in indices],
                          average_images=normalised[k:] if needs_average else None,
                          average_raw=raw[k:] if needs_average else None,
                          classes=run.metadata.get("classes"), batch_size=batch_size, delta=delta)
    export.manifest.update(_run_facts(run, data))
    return export
