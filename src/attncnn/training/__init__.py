"""Training and evaluation: configuration, LR schedule, checkpoints, run folders, the loop."""

from .checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from .config import TrainConfig, config_from_dict, resolve_config
from .distributed import Distributed, launch_from_env, per_process_batch, process_group
from .run_folder import RunFolder, RunFolderError
from .schedule import LRSchedule, warmup_cosine_multiplier
from .trainer import (EvalResult, NonFiniteLossError, TrainingError, TrainingInterrupted, evaluate, load_model,
                      make_optimizer, resolve_device, train)

__all__ = ["Checkpoint", "CheckpointError", "load_checkpoint", "save_checkpoint", "TrainConfig",
           "config_from_dict", "resolve_config", "RunFolder", "RunFolderError", "LRSchedule",
           "warmup_cosine_multiplier", "EvalResult", "TrainingError", "TrainingInterrupted",
           "NonFiniteLossError", "evaluate", "load_model",
           "make_optimizer", "resolve_device", "train", "Distributed", "launch_from_env", "per_process_batch",
           "process_group"]
