"""Run storage: what a training run leaves on disk, and how every command reads it back.

``config`` (:class:`TrainConfig`, the recipe a run folder records in ``config.json``); ``folder``
(:class:`RunFolder`: config, ``metrics.jsonl``, checkpoints, ``finished.json``) with ``lock`` (one
writer at a time) and ``main_process_folder`` (rank 0 writes under DDP); ``checkpoint`` (the file
format: safetensors weights + JSON metadata, written atomically, never unpickled); ``loading``
(a model from a run folder or a checkpoint, checked against its configuration before it is built);
``predictions`` (a model's per-image test predictions, ``predictions.json``, recorded once);
``withheld`` (a finished run shipped without its weights: ``weights-withheld.json`` says what they were);
``data_location`` (where a run's data set is on this machine, for a run folder that travelled).

Nothing outside this package writes a checkpoint; training, analysis, the theory, the studies and
the Python API read runs through it.
"""

from .checkpoint import (
           Checkpoint,
           CheckpointError,
           load_checkpoint,
           read_metadata,
           save_checkpoint,
           write_checkpoint,
)
from .config import PRECISIONS, TrainConfig, resolve_config
from .data_location import DATA_NAMES, await_pointed, is_data_name, point_at_data, same_data_file
from .errors import RunFolderError
from .folder import RunFolder
from .loading import checkpoint_of, load_model, resumable_config, resumable_recipe, trained_precision
from .predictions import PREDICTIONS_FILE, PredictionRecord, disagreements, read_predictions, write_predictions
from .withheld import WITHHELD_FILE, read_withheld, withheld_message

__all__ = ["Checkpoint", "CheckpointError", "load_checkpoint", "read_metadata", "save_checkpoint", "write_checkpoint",
           "PRECISIONS", "TrainConfig", "resolve_config", "RunFolder", "RunFolderError",
           "checkpoint_of", "load_model", "resumable_config", "resumable_recipe", "trained_precision",
           "PREDICTIONS_FILE", "PredictionRecord", "disagreements",
           "read_predictions", "write_predictions", "WITHHELD_FILE", "read_withheld", "withheld_message",
           "DATA_NAMES", "is_data_name", "same_data_file", "point_at_data",
           "await_pointed"]
