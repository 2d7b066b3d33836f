"""Where a run's data set is on this machine, for a run folder that travelled between machines.

A run records its data set in ``config.json`` (``"data"``); every command finds it by one rule
(:mod:`attncnn._recorded_data`), and none replaces a missing data set by another one. A run shipped
mid-way keeps only the data file's name, so before it resumes here :func:`point_at_data` records
where the same file is on this machine, once, on the process that writes the folder; under
``torchrun`` the other processes wait for it with :func:`await_pointed`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .._io import atomic_write_json
from .._recorded_data import DATA_NAMES, is_data_name, locate_recorded_data, not_here_message
from ..errors import InputError
from .errors import RunFolderError
from .folder import RunFolder

log = logging.getLogger("attncnn.runs")

__all__ = ["DATA_NAMES", "is_data_name", "same_data_file", "pointed_config", "point_at_data",
           "await_pointed"]


def same_data_file(stored: str, data: str) -> bool:
    """Whether ``data`` (given on this machine) can be the data set a run recorded as ``stored``: the
    same built-in name (any case, as the loader reads it), or the same file name, case included (the
    file travels by name; on most file systems another case is another file)."""
    if is_data_name(stored) or is_data_name(data):
        return stored.strip().lower() == data.strip().lower()
    return Path(data).name == Path(stored).name


def pointed_config(config: dict, data: str | None = None, *, folder: str | Path | None = None) -> dict | None:
    """``config`` (a run's ``config.json``) pointed at this machine's copy of its data set, or None
    when its data set is here as recorded (a built-in name or an absolute path). A run whose data set
    is not here gets ``data``, made absolute where it exists; one that recorded a relative path found
    here gets that file's absolute path. Only ``"data"`` changes.

    Args:
        config: the stored configuration (not changed).
        data: the data set given on this machine (``--data``); None: none was given.
        folder: the run folder: named in messages, and where a relative recorded path is also
            looked for.

    Raises:
        InputError: ``data`` has another file name than the run's own data set; no ``data`` for a
            run whose data set is not here; the run's relative path fits two different files here.
    """
    stored = config.get("data")
    if not isinstance(stored, str):
        return None
    who = "the run" if folder is None else str(folder)
    if is_data_name(stored):
        return None
    found = locate_recorded_data(stored, folder)
    if found is not None:
        if data and Path(data).expanduser().resolve() != Path(found).resolve():
            log.warning("%s: its data set %s is still here, and the run keeps it; --data %s is not used (a run "
                        "trains on one data set; a new run with --init-from trains on another)", who, found, data)
        return None if found == stored else {**config, "data": found}
    if data is None:
        raise InputError(not_here_message(stored, folder))
    if not same_data_file(stored, data):
        raise InputError(f"{who} was trained on {Path(stored).name}, which is not here; pass --data with "
                         f"the path of {Path(stored).name} on this machine (got {data!r})")
    given = Path(data).expanduser()
    return {**config, "data": str(given.resolve()) if given.exists() else data}


def point_at_data(folder: str | Path, data: str | None = None) -> bool:
    """Before resuming a run shipped from another machine: rewrite its ``config.json`` (atomically)
    as :func:`pointed_config` says. Returns True when it rewrote it; a run whose data set is here
    as recorded is left alone. Only the process that writes the run folder calls it (rank 0 under
    ``torchrun``).

    Args:
        folder: the unfinished run folder.
        data: the data set given on this machine (``--data``); None: the run's own must be here
            (a relative path found, the module's rule, is recorded absolute).

    Raises:
        InputError: as :func:`pointed_config`.
        RunFolderError: ``folder`` holds no run configuration.
    """
    config = RunFolder(folder, mode="read").read_config()
    pointed = pointed_config(config, data, folder=folder)
    if pointed is None:
        return False
    atomic_write_json(Path(folder) / "config.json", pointed)
    log.info("%s: its data set is %s on this machine", folder, pointed["data"])
    return True


def await_pointed(folder: str | Path, data: str | None = None, *,
                  timeout: float = 120.0, poll: float = 0.1) -> None:
    """On a process that does not write the run folder (rank > 0 under ``torchrun``): return once
    ``config.json`` needs no pointing any more (:func:`pointed_config` is None), i.e. once rank 0's
    :func:`point_at_data` has rewritten it, or at once where it needed none.

    Args:
        folder, data: as given to :func:`point_at_data` on rank 0.
        timeout: seconds to wait for rank 0.
        poll: seconds between reads.

    Raises:
        InputError: as :func:`pointed_config` (rank 0 refuses it too).
        RunFolderError: ``config.json`` is still not pointed after ``timeout`` seconds, or the folder
            holds no configuration.
    """
    deadline = time.monotonic() + timeout
    while pointed_config(RunFolder(folder, mode="read").read_config(), data, folder=folder) is not None:
        if time.monotonic() > deadline:
            raise RunFolderError(f"{folder}: rank 0 did not record where the run's data set is on this machine "
                                 f"within {timeout:g} s; its own error message says why")
        time.sleep(poll)
