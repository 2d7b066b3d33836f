"""The trained models the repository ships in ``results/``, by name: :func:`pretrained`.

``results/<suite>/...`` holds ordinary run folders, one per trained model and seed
(``results/mini/quadratic-mini/seed0``, ``results/efficiency/gpsa-mini/10pct/seed1``). They are
committed to the repository, not packed into the installed package (an installed wheel has no
``results/``), so :func:`pretrained` looks for them, in this order:

1. the folder passed as ``root``;
2. else the folder named by the environment variable ``ATTNCNN_RESULTS``;
3. else ``results/`` of the source checkout this package runs from (an editable install of a
   clone), then ``results/`` in the working directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from .classifier import Classifier, load_model

__all__ = ["RESULTS_ENV", "pretrained", "pretrained_path", "list_pretrained", "results_folders"]

#: environment variable naming a results folder (a clone's ``results/``)
RESULTS_ENV = "ATTNCNN_RESULTS"
#: the suite whose models a bare preset name means (the reduced-scale Table 1 study)
_DEFAULT_SUITE = "mini"
_SEED = re.compile(r"seed(\d+)$")


def results_folders(root: str | os.PathLike | None = None) -> list[Path]:
    """Where trained models are looked for, in order (see the module's description).

    Args:
        root: a folder given by the caller; when set, the only place looked in.
    """
    if root is not None:
        return [Path(root).expanduser()]
    env = os.environ.get(RESULTS_ENV)
    if env:
        return [Path(env).expanduser()]
    checkout = Path(__file__).resolve().parents[3]          # src/attncnn/api/ -> the repository
    found = [checkout / "results"] if (checkout / "src" / "attncnn").is_dir() else []
    cwd = Path.cwd() / "results"
    return found + ([cwd] if all(cwd.resolve() != f.resolve() for f in found) else [])


def _has_checkpoint(folder: Path) -> bool:
    """A finished run with a checkpoint: an unfinished one (a long study shipped between sessions
    with its resumable checkpoint, e.g. ``results/mini-long``) is not a trained model yet."""
    return (folder / "finished.json").is_file() and any(
        (folder / "checkpoints" / f"{which}.safetensors").is_file() for which in ("best", "last"))


def _candidates(name: str, seed: int, roots: list[Path]) -> list[Path]:
    """Folders that would hold ``name``'s run with ``seed``, in the order they are tried."""
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts:
        raise ValueError(f"a pretrained model's name is a preset such as 'quadratic-mini' or a path under "
                         f"results/ such as 'efficiency/gpsa-mini/10pct', got {name!r}")
    out = []
    for root in roots:
        if len(parts) == 1:
            out.append(root / _DEFAULT_SUITE / name / f"seed{seed}")
        out.append(root / name / f"seed{seed}")
    return out


def list_pretrained(root: str | os.PathLike | None = None) -> list[tuple[str, int]]:
    """The ``(name, seed)`` of every trained model found (see :func:`results_folders`).

    Names are what :func:`pretrained` takes: the preset alone for the reduced-scale study
    (``("quadratic-mini", 0)``), the path under ``results/`` otherwise
    (``("efficiency/gpsa-mini/10pct", 1)``).
    """
    found = set()
    for base in results_folders(root):
        if not base.is_dir():
            continue
        for config in base.rglob("config.json"):
            folder = config.parent
            match = _SEED.fullmatch(folder.name)
            if match is None or not _has_checkpoint(folder):
                continue
            name = folder.parent.relative_to(base).as_posix()
            if name.startswith(_DEFAULT_SUITE + "/") and name.count("/") == 1:
                name = name.split("/", 1)[1]
            found.add((name, int(match.group(1))))
    return sorted(found, key=lambda item: ("/" in item[0], item))      # the Table 1 study first


def pretrained_path(name: str, seed: int = 0, *, root: str | os.PathLike | None = None) -> Path:
    """The run folder of a shipped model (what :func:`pretrained` loads).

    Raises:
        ValueError: a name that is neither a preset nor a relative path.
        FileNotFoundError: no such trained model; the message names every folder looked in,
            what was found there, and how to point at a clone's ``results/``.
    """
    roots = results_folders(root)
    candidates = _candidates(name, seed, roots)
    for folder in candidates:
        if _has_checkpoint(folder):
            return folder
    available = list_pretrained(root)
    listing = (", ".join(f"{n} seed {s}" for n, s in available[:12]) + (", ..." if len(available) > 12 else "")
               if available else "none")
    raise FileNotFoundError(
        f"no trained model {name!r} seed {seed}: looked in {', '.join(str(c) for c in candidates)}. "
        f"Found there: {listing}. The trained models are committed to the repository's results/ folder and "
        f"do not come with an installed package: clone the repository and pass root='<clone>/results' or set "
        f"{RESULTS_ENV}=<clone>/results")


def pretrained(name: str, seed: int = 0, *, root: str | os.PathLike | None = None,
               device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Classifier:
    """A model trained by this project, by name, ready for images in ``[0, 1]``.

    Args:
        name: a preset of the reduced-scale Table 1 study (``results/mini``): ``"quadratic-mini"``
            (seeds 0-2), ``"learned-mini"`` (0-2), ``"quadratic-generalized-mini"``,
            ``"learned-content-mini"``, ``"resnet18-mini"``; or a path under ``results/`` without
            the seed, e.g. ``"efficiency/gpsa-mini/10pct"`` (:func:`list_pretrained` lists them).
        seed: which seed's run.
        root: a results folder to look in instead of the default places (see the module's
            description; ``$ATTNCNN_RESULTS`` sets it too).
        device, dtype: as :func:`load_model`.

    Returns:
        A :class:`Classifier` in eval mode (``model(images)``, ``model.predict(images)``,
        ``model.network``; :func:`attncnn.attention_maps` takes it as it is).

    Raises:
        FileNotFoundError: the model is not there (the message names where it looked and the fix).
        ValueError, attncnn.training.CheckpointError: as :func:`load_model`.
    """
    return load_model(pretrained_path(name, seed, root=root), device=device, dtype=dtype)
