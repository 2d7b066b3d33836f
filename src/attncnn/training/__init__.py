"""Training and evaluation, one concern per module.

``config`` (the options, declared once) -> ``options`` (the ``train`` flags built from them);
``components`` (device, loaders, optimizer, schedule) and ``schedule``; ``state`` (TrainState: all
that survives a restart) with ``rng``; ``loop`` (:func:`train`) with ``progress``, ``signals``,
``saver`` and ``errors``, its step in ``step``; ``evaluation``; ``checkpoint`` (the file format) beside ``loading``
(models from files); ``run_folder``, ``distributed`` and ``main_process_folder`` (the run folder
under DDP); ``run_precision`` (fp32 / bf16); ``path_choice`` and ``compile_choice`` (the attention path
and whether to compile, measured per machine and cached by ``machine_cache``).
"""

from .checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint, write_checkpoint
from .components import make_optimizer, resolve_device
from .config import TrainConfig, config_from_dict, resolve_config
from .distributed import Distributed, launch_from_env, per_process_batch, process_group
from .errors import NonFiniteLossError, TrainingError, TrainingInterrupted
from .evaluation import EvalResult, evaluate
from .loading import load_model
from .loop import train
from .run_folder import RunFolder, RunFolderError
from .schedule import LRSchedule, warmup_cosine_multiplier
from .state import TrainState

__all__ = ["Checkpoint", "CheckpointError", "load_checkpoint", "save_checkpoint", "write_checkpoint", "TrainConfig",
           "config_from_dict", "resolve_config", "RunFolder", "RunFolderError", "LRSchedule",
           "warmup_cosine_multiplier", "EvalResult", "TrainingError", "TrainingInterrupted",
           "NonFiniteLossError", "evaluate", "load_model", "TrainState",
           "make_optimizer", "resolve_device", "train", "Distributed", "launch_from_env", "per_process_batch",
           "process_group"]
