"""Starting a run from another run's weights (``--init-from``): weights only, checked before loading."""

from __future__ import annotations

import logging
from pathlib import Path

from torch import nn

from ..runs.checkpoint import load_checkpoint
from ..runs.loading import check_weights, file_specs
from .errors import TrainingError

__all__ = ["load_weights", "init_from_mismatch"]

log = logging.getLogger(__name__)


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load a checkpoint's weights into a freshly built ``model`` (``TrainConfig.init_from``); optimiser
    state, random state and epoch counters start anew (a fine-tune, as the reference's
    ``runs/quadratic-generalized-pruned``).

    Raises:
        CheckpointError: missing or unreadable file (message names it).
        TrainingError: the weights do not fit the model (names the mismatching tensors and the
            preset/model options to use).
    """
    path = Path(path)
    try:
        check_weights(path, model, file_specs(path))
    except ValueError as err:
        raise init_from_mismatch(path, err) from err
    model.load_state_dict(load_checkpoint(path).model_state)
    log.info("initialised the weights from %s", path)


def init_from_mismatch(path: str | Path, err: ValueError) -> TrainingError:
    """The error for ``--init-from`` weights that do not fit the run's model, with the fix."""
    return TrainingError(f"--init-from {path}: {err}. Build the same model as the checkpoint "
                         "(same --preset and --set options).")
