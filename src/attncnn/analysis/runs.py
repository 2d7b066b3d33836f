"""Reading what the analysis tools need from a run folder or a checkpoint file.

A *run* argument is either a run folder (``config.json``, ``metrics.jsonl``, ``checkpoints/``)
or one ``.safetensors`` checkpoint written by ``attncnn train``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from ..data import CIFAR_MEAN, CIFAR_STD, load_dataset, run_data
from ..errors import InputError, MissingFileError
from ..runs import RunFolder, load_model, read_withheld
from ..runs.loading import DEFAULT_CHECKPOINT, build_checked, checkpoint_of
from ..runs.config import without_paths

__all__ = ["Run", "ImageIndexError", "open_run", "run_label", "unique_labels", "label_runs", "test_count",
           "test_images", "parse_indices", "default_query", "parse_query", "shareable_dataset"]


class ImageIndexError(InputError):
    """Test-image indices beyond the test split of a data set.

    Attributes:
        indices: the indices that do not exist (each ``>= count``), in the order given.
        count: the number of test images.
        source: the data set, as its loader describes it.
    """

    def __init__(self, indices: Sequence[int], count: int, source: str, message: str | None = None) -> None:
        self.indices = list(indices)
        self.count = count
        self.source = source
        super().__init__(message or f"image indices {self.indices} exceed the {count} test images of {source}")


def shareable_dataset(metadata: dict, data: str | None = None) -> str | None:
    """The data set of a run as pages and reports meant for sharing show it: its name and content
    digest (``"cifar10-jpeg.zip (sha256:1a2b3c4d5e6f)"``), never a local path; ``data``: a data set
    given on the command line instead (its file name is shown)."""
    if data is None and isinstance(metadata.get("dataset_name"), str):
        return metadata["dataset_name"]
    if data is None:
        config = metadata.get("config")
        data = config.get("data") if isinstance(config, dict) else None
    return None if data is None else Path(str(data)).name


@dataclass
class Run:
    """A loaded run.

    Attributes:
        path: what was given (folder or checkpoint file).
        name: a short label: ``"<preset> seed <seed>"`` (:func:`run_label`), else the folder name
            (or the checkpoint's stem with its folder).
        model: the network, eval mode, CPU; None for a run shipped without its weights.
        metadata: the checkpoint's metadata (``config``, ``epoch``, ``dataset``, ``parameters``, ...).
        folder: the run folder, or None for a bare checkpoint outside one.
        metrics: the records of ``metrics.jsonl`` (empty for a bare checkpoint).
        checkpoint: the checkpoint file the weights came from (a folder's ``last``), if known.
        withheld: the ``weights-withheld.json`` record of a run shipped without its weights, else None.
    """

    path: Path
    name: str
    model: nn.Module | None
    metadata: dict
    folder: RunFolder | None = None
    metrics: list[dict] = field(default_factory=list)
    checkpoint: Path | None = None
    withheld: dict | None = None

    def periodic_checkpoints(self) -> list[tuple[int, Path]]:
        """``(epoch, path)`` of the folder's ``epoch_NNNN`` checkpoints (empty without a folder)."""
        return self.folder.periodic_checkpoints() if self.folder is not None else []

    @property
    def kind(self) -> str:
        """``"resnet"``, or the attention kind of an image transformer (``"quadratic"``, ...)."""
        if self.model is None:                  # weights withheld: the stored model options say it
            return (self.metadata.get("model_config") or {}).get("attention") or self.metadata.get("arch", "unknown")
        return getattr(getattr(self.model, "config", None), "attention", None) or self.metadata.get("arch", "unknown")

    def network(self) -> nn.Module:
        """The run's network: :attr:`model`, or for a run shipped without its weights the same
        architecture freshly initialised (CPU), for what does not depend on the weights (parameter
        counts, FLOPs), never for what the trained weights compute."""
        if self.model is not None:
            return self.model
        # an older checkpoint's attention paths are not used: the layers' own rule picks one here
        return build_checked(self.metadata["arch"], without_paths(self.metadata["model_config"]),
                             source=str(self.path)).eval()


def open_run(path: str | Path, *, withheld: bool = False) -> Run:
    """Load a run folder (its ``last`` checkpoint, as every command; the choice is logged) or a
    checkpoint file.

    Args:
        withheld: accept a finished run folder shipped without its weights
            (:mod:`attncnn.runs.withheld`): its :class:`Run` has ``model=None`` and the metadata its
            record kept.

    Raises:
        FileNotFoundError: nothing at ``path``, or a folder without a ``last`` checkpoint.
        attncnn.runs.RunFolderError, attncnn.runs.CheckpointError, ValueError: unreadable run.
    """
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"no run folder or checkpoint at {path}")
    folder = None
    if path.is_dir():
        folder = RunFolder(path, mode="read")
        name = path.resolve().name
        record = read_withheld(path) if withheld else None
        if record is not None and not folder.checkpoint_path(DEFAULT_CHECKPOINT).exists():
            meta = record["metadata"]
            return Run(path, run_label(meta) or name, None, meta, folder, folder.read_metrics(), None, record)
    else:
        parent = path.parent.parent if path.parent.name == "checkpoints" else None
        if parent is not None and (parent / "config.json").is_file():
            folder = RunFolder(parent, mode="read")
        name = f"{(parent or path.parent).resolve().name}/{path.stem}"
    model, meta = load_model(path, "cpu")     # a folder: its last checkpoint, logged
    metrics = folder.read_metrics() if folder is not None else []
    return Run(path, run_label(meta, None if path.is_dir() else path) or name, model, meta, folder, metrics,
               checkpoint_of(path))


def run_label(metadata: dict, checkpoint: Path | None = None) -> str | None:
    """What figures, tables and pages call a run: ``"<preset> seed <seed>"`` from its stored
    configuration, followed by the checkpoint's stem for a checkpoint other than ``best``/``last``
    (``"quadratic-mini seed 0 epoch_0003"``). None when the metadata names no preset."""
    config = metadata.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("preset"), str):
        return None
    label = f"{config['preset']} seed {config.get('seed', '?')}"
    if checkpoint is not None and checkpoint.stem not in ("best", "last"):
        label += f" {checkpoint.stem}"
    return label


def unique_labels(labels: Sequence[str], paths: Sequence[str | Path]) -> list[str]:
    """``labels`` made distinct: each group of equal labels gets the shortest trailing part of its
    runs' paths that tells them apart, in brackets (``"demo seed 42 (quadratic)"``).

    Raises:
        InputError: the same run folder or checkpoint given twice.
    """
    resolved = [Path(p).resolve() for p in paths]
    out = list(labels)
    for label in set(labels):
        group = [i for i, other in enumerate(labels) if other == label]
        if len(group) < 2:
            continue
        if len({resolved[i] for i in group}) < len(group):
            raise InputError(f"the same run is given twice ({label}: {', '.join(str(paths[i]) for i in group)}); "
                             "give each run once")
        depth = max(len(resolved[i].parts) for i in group)
        for k in range(1, depth + 1):
            tails = [Path(*resolved[i].parts[-k:]).as_posix() for i in group]
            if len(set(tails)) == len(group):
                break
        for i, tail in zip(group, tails):
            out[i] = f"{label} ({tail})"
    return out


def label_runs(runs: Sequence[Run]) -> list[Run]:
    """``runs`` with names made distinct by :func:`unique_labels` (names changed in place).

    Raises:
        InputError: the same run given twice.
    """
    for run, name in zip(runs, unique_labels([r.name for r in runs], [r.path for r in runs])):
        run.name = name
    return list(runs)


def parse_indices(text: str) -> list[int]:
    """``"2,3,19,56"`` -> ``[2, 3, 19, 56]``.

    Raises:
        InputError: not a comma-separated list of non-negative integers.
    """
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise InputError(f"expected comma-separated image indices such as 2,3,19,56, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise InputError(f"expected non-negative image indices, got {text!r}")
    return values


def default_query(height: int, width: int) -> tuple[int, int]:
    """The query token figures and the viewer page show unless told otherwise: the center of an
    ``height x width`` token grid, ``(height // 2, width // 2)`` as (row, column), as the paper's
    Fig. 5 takes it (``page.js`` computes the same for the viewer page)."""
    return height // 2, width // 2


def parse_query(text: str) -> tuple[int, int]:
    """``"4,5"`` -> ``(4, 5)`` (row, column of the query token).

    Raises:
        InputError: not two comma-separated integers.
    """
    parts = text.split(",")
    try:
        row, col = (int(p) for p in parts)
    except ValueError:
        raise InputError(f"expected a query token as ROW,COL (e.g. 8,8), got {text!r}") from None
    return row, col


def test_count(run: Run, *, data: str | None = None, data_dir: str | None = None) -> int:
    """Number of test images of the run's data set (or ``data``), found as :func:`attncnn.data.run_data` says.

    Raises:
        attncnn.data.DataError: the data set cannot be found.
    """
    stored = run.metadata.get("config", {})
    dataset = load_dataset(run_data(stored.get("data"), data, run=run.path),
                           data_dir=data_dir or stored.get("data_dir"))
    return len(dataset.test.labels)


def test_images(run: Run, indices: Sequence[int], *, data: str | None = None,
                data_dir: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Test-split images of the run's data set (or ``data``), by index; the run's own is found as
    :func:`attncnn.data.run_data` says (never replaced by another one).

    Returns:
        ``(normalised float images (B, C, H, W), uint8 images (B, C, H, W))``; normalised with
        the CIFAR mean/std the training loader uses.

    Raises:
        attncnn.data.DataError: the data set cannot be found.
        ImageIndexError: an index beyond the test split (a ValueError).
    """
    stored = run.metadata.get("config", {})
    dataset = load_dataset(run_data(stored.get("data"), data, run=run.path),
                           data_dir=data_dir or stored.get("data_dir"))
    images = dataset.test.images
    bad = [i for i in indices if i >= len(images)]
    if bad:
        raise ImageIndexError(bad, len(images), dataset.source)
    raw = images[list(indices)]
    mean = torch.tensor(CIFAR_MEAN).view(1, -1, 1, 1)
    std = torch.tensor(CIFAR_STD).view(1, -1, 1, 1)
    return (raw.float() / 255 - mean) / std, raw
