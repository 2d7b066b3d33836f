"""A trained model's per-image test predictions, kept beside its run: ``predictions.json``.

``attncnn evaluate RUN --predictions FILE`` records, once, the top-1 class predicted for every
image (the record reproduces the run's accuracy by itself); a later check evaluates a fixed
class-balanced sample (``attncnn evaluate RUN --sample N``) and compares image by image
(:func:`disagreements`): rounding on another machine flips a few images in a thousand.

The file (JSON): ``checkpoint`` (its file name), ``epoch``, ``dataset`` (the data set's shareable
name, no path), ``precision``, ``torch``, ``test_accuracy``, ``indices`` (the test images
evaluated, in order; ``null`` for the whole split), ``predictions`` (one class index per image),
``device`` (e.g. ``"cpu: AMD EPYC"``) and ``precision_from`` (where the precision came from, in
words); the last two are absent from older records, read as None.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .._io import atomic_write_text
from ..errors import InputError

__all__ = ["PREDICTIONS_FILE", "PredictionRecord", "write_predictions", "read_predictions", "disagreements"]

#: the record's name in a run folder
PREDICTIONS_FILE = "predictions.json"


@dataclass(frozen=True)
class PredictionRecord:
    """What ``attncnn evaluate`` predicted for each test image it evaluated (see the module's description)."""

    checkpoint: str
    epoch: int | None
    dataset: str
    precision: str
    torch: str
    test_accuracy: float
    indices: list[int] | None
    predictions: list[int]
    device: str | None = None
    precision_from: str | None = None

    def __post_init__(self) -> None:
        if self.indices is not None and len(self.indices) != len(self.predictions):
            raise InputError(f"a prediction record names {len(self.indices)} images but holds "
                             f"{len(self.predictions)} predictions")

    def for_images(self, indices: list[int]) -> list[int]:
        """The recorded predictions of the test images ``indices`` (a record of the whole split, or
        one whose sample holds them all).

        Raises:
            InputError: an image the record does not hold.
        """
        where = (dict(zip(self.indices, range(len(self.indices)))) if self.indices is not None
                 else range(len(self.predictions)))
        missing = [i for i in indices if i not in where]
        if missing:
            raise InputError(f"the record holds no prediction for test images {missing[:5]}"
                             f"{' ...' if len(missing) > 5 else ''}; record the whole split "
                             "(attncnn evaluate RUN --predictions FILE, without --sample)")
        return [self.predictions[where[i]] for i in indices]


def write_predictions(path: str | os.PathLike[str], record: PredictionRecord) -> None:
    """Write ``record`` to ``path`` as JSON (atomically: a failed write leaves the old file)."""
    fields = asdict(record)
    body = {k: v for k, v in fields.items() if k not in ("indices", "predictions")}
    for optional in ("device", "precision_from"):
        if body[optional] is None:
            del body[optional]          # not known: left out, as in records written before it was kept
    # the lists on one line each: 10,000 entries a line apiece would make a 60,000-line file
    text = json.dumps(body, indent=1)[:-2] + ",\n"
    text += f' "indices": {json.dumps(fields["indices"], separators=(",", ":"))},\n'
    text += f' "predictions": {json.dumps(fields["predictions"], separators=(",", ":"))}\n}}\n'
    atomic_write_text(path, text)


def read_predictions(path: str | os.PathLike[str]) -> PredictionRecord:
    """Read a record written by :func:`write_predictions`.

    Raises:
        FileNotFoundError: no such file. ValueError: not such a record (the message names the file
            and the problem).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        optional = {"device", "precision_from"}
        return PredictionRecord(**{name: data[name] for name in PredictionRecord.__dataclass_fields__
                                   if name not in optional or name in data})
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise InputError(f"{path} is not a prediction record of attncnn evaluate --predictions ({err}); "
                         "record it again") from err


def disagreements(predicted: list[int], recorded: list[int]) -> int:
    """How many images two lists of predictions (the same images, in the same order) disagree on.

    Raises:
        ValueError: lists of different lengths.
    """
    if len(predicted) != len(recorded):
        raise ValueError(f"{len(predicted)} predictions against {len(recorded)} recorded: not the same images")
    return sum(a != b for a, b in zip(predicted, recorded))
