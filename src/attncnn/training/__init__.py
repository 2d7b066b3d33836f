"""Training and evaluation, one concern per module.

``components`` (loaders, optimizer, schedule) and ``schedule``; ``state`` (TrainState: all that
survives a restart) with ``rng`` and ``init_from``; ``run_options`` (:class:`RunOptions`: how this
machine runs a run), ``plan`` (:class:`RunPlan`: those options resolved by
:func:`attncnn.perf.make_plan`) and ``choices`` (the loop's call of the plan's chooser,
:class:`RunParts` in, :class:`Choices` out); ``loop`` (:func:`train`) with ``progress``,
``signals``, ``saver`` and ``errors``, its step in ``step``; ``evaluation``; ``distributed`` (DDP
under torchrun). This package measures nothing itself (that is :mod:`attncnn.perf`).
"""

from ..runs.config import TrainConfig, resolve_config
from .components import make_optimizer
from .distributed import Distributed, launch_from_env, per_process_batch, process_group
from .errors import NonFiniteLossError, TrainingError, TrainingInterrupted
from .evaluation import EvalResult, evaluate
from .loop import count_test_passes, evaluates, train
from .plan import Choices, RunParts, RunPlan
from .run_options import RunOptions
from .schedule import LRSchedule, warmup_cosine_multiplier
from .state import TrainState

__all__ = ["TrainConfig", "resolve_config", "RunOptions", "RunPlan", "RunParts", "Choices", "LRSchedule",
           "warmup_cosine_multiplier", "EvalResult", "TrainingError", "TrainingInterrupted", "NonFiniteLossError",
           "evaluate", "TrainState", "make_optimizer", "train", "evaluates", "count_test_passes", "Distributed",
           "launch_from_env", "per_process_batch", "process_group"]
