"""The trained models of this project, by name: :func:`pretrained`.

``results/<suite>/...`` holds ordinary run folders, one per trained model and seed
(``results/mini/quadratic-mini/seed0``). A preset's name alone means its longest finished run among
the suites; a path under ``results/`` names one run exactly.

:func:`pretrained` looks, in this order:

1. in a results folder: ``root`` if given (then the only place); else ``$ATTNCNN_RESULTS``; else
   ``results/`` of the source checkout this package runs from, then ``results/`` in the working
   directory;
2. then in the models fetched with :func:`attncnn.download` into ``<user cache>/models/``
   (:func:`attncnn._cache_dir.user_cache_dir`), then the five 60-epoch mini models that come with
   the package (``attncnn/pretrained_models/``: seed 0 of ``results/mini-long``, bfloat16 weights).

Both places of step 2 are laid out like ``results/``, so a name means the same run wherever it is
found; a clone's own ``results/`` wins over them.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from pathlib import Path

import torch

from ..errors import AttncnnError, InputError, MissingFileError
from ..models.presets import PRESETS
from ..runs import read_withheld, withheld_message
from .classifier import Classifier, load_model
from .downloads import downloadable, downloads_folder

__all__ = ["RESULTS_ENV", "PACKAGED_MODELS", "pretrained", "pretrained_path", "list_pretrained", "results_folders",
           "model_folders"]

#: environment variable naming a results folder (a clone's ``results/``)
RESULTS_ENV = "ATTNCNN_RESULTS"
#: the trained models that come with the installed package, laid out like ``results/``
PACKAGED_MODELS = Path(__file__).resolve().parents[1] / "pretrained_models"
_SEED = re.compile(r"seed(\d+)$")

log = logging.getLogger(__name__)


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


def model_folders(root: str | os.PathLike | None = None) -> list[list[Path]]:
    """Every folder trained models are looked for in, as groups in order of precedence: the results
    folders (:func:`results_folders`), then the downloaded and packaged models. A name is taken from
    the first group that holds a finished run of it; within a group, its longest run.

    Args:
        root: a folder given by the caller; when set, the only place looked in.
    """
    if root is not None:
        return [results_folders(root)]
    return [results_folders(), [downloads_folder(), PACKAGED_MODELS]]


def packaged_names() -> list[str]:
    """The presets whose trained model comes with the installed package (``"quadratic-mini"``, ...)."""
    return sorted({p.parent.name for p in PACKAGED_MODELS.glob("*/*/seed0") if _has_checkpoint(p)})


def _has_checkpoint(folder: Path) -> bool:
    """A finished run with a checkpoint: an unfinished one (a long study shipped between sessions
    with its resumable checkpoint, e.g. ``results/mini-long``) is not a trained model yet."""
    return (folder / "finished.json").is_file() and any(
        (folder / "checkpoints" / f"{which}.safetensors").is_file() for which in ("best", "last"))


def _candidates(name: str, seed: int, roots: list[Path]) -> list[Path]:
    """Folders that would hold ``name``'s run with ``seed``: for a preset's name alone, the run of
    every suite folder (``<root>/<suite>/<name>/seed<seed>``), then ``<root>/<name>/seed<seed>``."""
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts:
        raise InputError(f"a pretrained model's name is a preset such as 'quadratic-mini' or a path under "
                         f"results/ such as 'efficiency/gpsa-mini/10pct', got {name!r}")
    out = []
    for root in roots:
        if len(parts) == 1 and root.is_dir():
            out += [suite / name / f"seed{seed}" for suite in sorted(root.iterdir()) if suite.is_dir()]
        out.append(root / name / f"seed{seed}")
    return out


def _epochs(folder: Path) -> int:
    """The epochs a finished run trained (its ``finished.json``; 0 where it says none)."""
    try:
        epochs = json.loads((folder / "finished.json").read_text()).get("epochs")
    except (OSError, ValueError, AttributeError):
        return 0
    return epochs if isinstance(epochs, int) else 0


def _choose(name: str, seed: int, groups: list[list[Path]]) -> tuple[Path | None, list[Path]]:
    """``(the run name and seed mean, the folders of its group)``: the longest finished run of the
    first group of :func:`model_folders` that has one (the first such on a tie); ``(None, every
    folder looked at)`` if none."""
    looked = []
    for roots in groups:
        candidates = _candidates(name, seed, roots)
        chosen = max((f for f in candidates if _has_checkpoint(f)), key=_epochs, default=None)
        if chosen is not None:
            return chosen, candidates
        looked += candidates
    return None, looked


def list_pretrained(root: str | os.PathLike | None = None) -> list[tuple[str, int]]:
    """The ``(name, seed)`` of every trained model found (see :func:`model_folders`), named as
    :func:`pretrained` takes them: the preset alone for a preset's longest run
    (``("quadratic-mini", 0)``), the path under ``results/`` otherwise (``("mini/quadratic-mini", 0)``)."""
    groups = model_folders(root)
    found = set()
    for base in (base for roots in groups for base in roots):
        if not base.is_dir():
            continue
        for config in base.rglob("config.json"):
            folder = config.parent
            match = _SEED.fullmatch(folder.name)
            name = folder.parent.relative_to(base).as_posix()
            if match is None or name.startswith(".") or not _has_checkpoint(folder):
                continue                                # ".download-*": a download not finished yet
            seed, preset = int(match.group(1)), folder.parent.name
            if name.count("/") == 1 and _choose(preset, seed, groups)[0] == folder:
                name = preset
            found.add((name, seed))
    return sorted(found, key=lambda item: ("/" in item[0], item))      # the presets' own runs first


def pretrained_path(name: str, seed: int = 0, *, root: str | os.PathLike | None = None) -> Path:
    """The run folder of a shipped model (what :func:`pretrained` loads): for a preset's name alone,
    its longest finished run (the most epochs; see the module's description).

    Raises:
        InputError: a name that is neither a preset nor a relative path.
        FileNotFoundError: no such trained model; the message names every folder looked in,
            what was found there, and how to point at a clone's ``results/``.
    """
    groups = model_folders(root)
    chosen, candidates = _choose(name, seed, groups)
    if chosen is not None:
        others = [f for f in candidates if f != chosen and _has_checkpoint(f)]
        if others:
            log.info("%s seed %d: the %d-epoch run %s (also trained: %s)", name, seed, _epochs(chosen), chosen,
                     ", ".join(f"{f} ({_epochs(f)} epochs)" for f in others))
        if root is None and not any(chosen.is_relative_to(base) for base in groups[0]):
            _say_unusable_results_env(name, chosen)
        return chosen
    raise MissingFileError(_not_found(name, seed, [base for bases in groups for base in bases], candidates,
                                      list_pretrained(root)))


def _say_unusable_results_env(name: str, chosen: Path) -> None:
    """One warning where :data:`RESULTS_ENV` names no folder and ``name`` was found elsewhere (the
    user cache, the package): a user who pointed it at their own results gets another model."""
    env = os.environ.get(RESULTS_ENV)
    if not env or Path(env).expanduser().is_dir():
        return
    what = "is a file, not a folder" if Path(env).expanduser().exists() else "does not exist"
    log.warning("%s=%s %s; loaded %s from %s instead (set %s to a results folder, or unset it)", RESULTS_ENV, env,
                what, name, chosen, RESULTS_ENV)


def _not_found(name: str, seed: int, roots: list[Path], candidates: list[Path],
               available: list[tuple[str, int]]) -> str:
    """What :func:`pretrained_path` says of a model it cannot find: what helps most first (a run shipped
    without its weights, close names, how to train a preset), then where it looked, what is there, and
    the ways to get a trained model (:func:`_ways`)."""
    sentences = [f"no trained model {name!r} seed {seed}."]
    for folder in candidates:           # trained, but shipped without its weights: say so first
        record = read_withheld(folder) if (folder / "finished.json").is_file() else None
        if record is not None:
            sentences.append(withheld_message(folder, record) + ".")
    within = (f"<suite>/{name}/seed{seed} and {name}/seed{seed}" if len(Path(name).parts) == 1
              else f"{name}/seed{seed}")
    looked = f"Looked for {within} in {', '.join(str(r) for r in dict.fromkeys(roots))}."
    if not available:
        return " ".join(sentences + [looked, "No trained model is there.", _ways(name)])
    names = sorted({n for n, _ in available})
    seeds = sorted(s for n, s in available if n == name)
    if seeds:
        sentences.append(f"{name!r} is there with seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}.")
    else:
        # runs of this very network inside a study's folders first ("deit-mini" ->
        # "efficiency-scarce/deit-mini/100pct"), then its family, then near spellings
        close = ([n for n in names if name in Path(n).parts] + [n for n in names if n.startswith(f"{name}-")]
                 + difflib.get_close_matches(name, names, n=3, cutoff=0.6))
        close = list(dict.fromkeys(c for c in close if c != name))[:4]
        if close:
            sentences.append("Closest there: " + ", ".join(
                f"{c} (seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))})"
                for c in close for s in [sorted(k for n, k in available if n == c)]) + ".")
        preset = Path(name).name
        if preset in PRESETS and not any(preset in Path(n).parts for n in names):
            sentences.append(f"{preset!r} is a preset none of whose finished runs is there: train it with "
                             f"`attncnn train --preset {preset}` and load the run folder with "
                             f"attncnn.load_model(<run folder>).")
    listing = ", ".join(f"{n} seed {s}" for n, s in available[:12])
    more = f", ... ({len(available)} in all: attncnn.list_pretrained())" if len(available) > 12 else ""
    sentences += [looked, f"Found there: {listing}{more}."]
    return " ".join(sentences + [_ways(name)])


def _ways(name: str) -> str:
    """The three ways to get a trained model (the end of every not-found message), naming the
    download of ``name`` where it is one."""
    preset = Path(name).name
    try:
        names = downloadable()
    except AttncnnError:                # the manifest gone from a source tree: say the rest anyway
        names = []
    fetch = (f"`attncnn download {preset} --from URL_OR_FOLDER`" if preset in names
             else f"`attncnn download NAME --from URL_OR_FOLDER` (NAME: {', '.join(names)})")
    packaged = ", ".join(packaged_names()) or "none in this installation"
    return (f"A trained model comes one of three ways: with the installed package (the 60-epoch mini models: "
            f"{packaged}); from a clone of the repository, whose results/ folder holds every model (run from the "
            f"clone, or pass root='<clone>/results' or set {RESULTS_ENV}=<clone>/results); or fetched on request "
            f"into {downloads_folder()} with {fetch} from a copy of a clone's results/ folder, local or served "
            f"over http(s).")


def pretrained(name: str, seed: int = 0, *, root: str | os.PathLike | None = None,
               device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Classifier:
    """A model trained by this project, by name, ready for images in ``[0, 1]``.

    Args:
        name: a preset, meaning its longest finished run (``"quadratic"``: width 400, 60 epochs;
            ``"quadratic-mini"``: width 64, 60 epochs; the choice is logged when several runs exist);
            or a path under ``results/`` without the seed, e.g. ``"mini/quadratic-mini"``
            (:func:`list_pretrained` lists them). An installed package without a clone has the five
            60-epoch mini models (seed 0), and the width-400 ones after :func:`attncnn.download`.
        seed: which seed's run.
        root: a results folder to look in instead of every other place (see the module's description;
            ``$ATTNCNN_RESULTS`` replaces the clone's ``results/`` but keeps the downloaded and
            packaged models).
        device, dtype: as :func:`load_model`.

    Returns:
        A :class:`Classifier` in eval mode (``model(images)``, ``model.predict(images)``,
        ``model.network``).

    Raises:
        FileNotFoundError: the model is not there (the message names where it looked, what is
            there, and the ways to get a model).
        InputError, attncnn.runs.CheckpointError: as :func:`load_model`.
    """
    return load_model(pretrained_path(name, seed, root=root), device=device, dtype=dtype)
