"""Run storage: what a training run leaves on disk, and how every command reads it back.

``config`` (:class:`TrainConfig`, the recipe in ``config.json``); ``folder`` (:class:`RunFolder`)
with ``lock`` and ``main_process_folder``; ``checkpoint`` (safetensors weights + JSON metadata,
never unpickled); ``loading`` (a model from a run folder or a checkpoint, checked before it is
built); ``predictions`` (``predictions.json``); ``withheld`` (a run shipped without its weights);
``data_location`` (where a run's data set is on this machine). Nothing outside this package writes
a checkpoint.
"""

from .checkpoint import Checkpoint, CheckpointError, load_checkpoint, read_metadata, save_checkpoint, write_checkpoint
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
           "PREDICTIONS_FILE", "PredictionRecord", "disagreements", "read_predictions", "write_predictions",
           "WITHHELD_FILE", "read_withheld", "withheld_message", "DATA_NAMES", "is_data_name", "same_data_file",
           "point_at_data", "await_pointed"]
