"""Where the data set a run recorded is on this machine: one rule for every command that reads a run
(:func:`attncnn.data.run_data` and :mod:`attncnn.runs.data_location`, which import nothing from
each other).

What a run's ``config.json`` records as ``"data"``, and where it is looked for:

* a built-in name (``cifar10``, ``cifar100``): the official archives, through ``data_dir``;
* an absolute path (what every new run records): there, and nowhere else;
* a relative path (an older run, or a shared run folder keeping only the file name): relative to
  the current folder, then to the run folder and each folder above it, taken only where exactly
  one file is found (else the command asks for ``--data``).

A data set that is not found is never replaced by another one: the caller stops and asks for
``--data`` with :func:`not_here_message`.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import InputError

__all__ = ["DATA_NAMES", "is_data_name", "run_folder_of", "locate_recorded_data", "not_here_message"]

#: data sets a run names rather than locates
DATA_NAMES = ("cifar10", "cifar100")


def is_data_name(stored: str) -> bool:
    """Whether a run's ``"data"`` is a built-in data set's name (:data:`DATA_NAMES`, any case, as the
    data loader reads it) rather than a path."""
    return stored.strip().lower() in DATA_NAMES


def run_folder_of(run: str | os.PathLike[str] | None) -> Path | None:
    """The run folder of ``run``: a run folder itself, or a checkpoint file (``<run>/checkpoints/x.safetensors``
    gives ``<run>``; a file elsewhere, its own folder); None for None."""
    if run is None:
        return None
    path = Path(run).expanduser()
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def _places(run: str | os.PathLike[str] | None) -> list[Path]:
    """Folders a relative recorded path is tried against: the current folder, then the run folder and
    each folder above it (resolved, each once, in that order)."""
    places = [Path.cwd().resolve()]
    folder = run_folder_of(run)
    if folder is not None:
        folder = folder.resolve()
        places += [folder, *folder.parents]
    return list(dict.fromkeys(places))


def locate_recorded_data(stored: str, run: str | os.PathLike[str] | None = None) -> str | None:
    """The data set a run recorded as ``stored``, found on this machine by the module's rule.

    Args:
        stored: the run's ``config["data"]``.
        run: the run folder (or one of its checkpoint files); None: a relative path is tried
            against the current folder only.

    Returns:
        ``stored`` for a built-in name or an absolute path that exists; the absolute path of the
        one file a relative ``stored`` names; None where it is not on this machine.

    Raises:
        InputError: a relative ``stored`` names different files from two of the places tried (the
            message names both and ``--data``).
    """
    if is_data_name(stored):
        return stored
    path = Path(stored.strip()).expanduser()
    if path.is_absolute():
        return stored if path.exists() else None
    found = list(dict.fromkeys((place / path).resolve() for place in _places(run) if (place / path).exists()))
    if len(found) > 1:
        raise InputError(f"{_who(run)} recorded its data set as {stored}, relative to the folder its training "
                         f"started in, and both {found[0]} and {found[1]} fit; pass --data with the one it was "
                         "trained on")
    return str(found[0]) if found else None


def _who(run: str | os.PathLike[str] | None) -> str:
    folder = run_folder_of(run)
    return "the run" if folder is None else f"run {folder}"


def not_here_message(stored: str, run: str | os.PathLike[str] | None = None) -> str:
    """The one-line refusal for a run whose data set ``stored`` is not on this machine: it names the
    data set and the fix, ``--data`` with the path of the same file here."""
    relative = not Path(stored.strip()).expanduser().is_absolute()
    looked = (" (looked for it relative to the current folder" +
              (", to the run folder and to the folders above it)" if run is not None else ")")) if relative else ""
    return (f"{_who(run)} was trained on {stored}, which is not here{looked}; pass --data with the path of "
            f"{Path(stored.strip()).name} on this machine")
