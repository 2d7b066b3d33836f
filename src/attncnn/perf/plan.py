"""Making a run's plan for the machine at hand: :func:`make_plan` for a new run, :func:`resume_plan`
for a run continued here.

The plan (:class:`attncnn.training.RunPlan`) holds every choice of a run that depends on the
machine rather than on the experiment: the device, the precision of this segment, the attention
paths, whether to compile and to run deterministically. It is made from the recipe
(:class:`~attncnn.runs.TrainConfig`) and the run-time options (:class:`attncnn.training.RunOptions`,
the command's flags); where they leave a choice open, it is decided here, by the rules of this
package, before the training loop starts, and nothing of it is written into ``config.json`` (the
loop records it in ``machine.json``):

* precision: ``auto`` becomes ``bf16`` where the device has fast bf16 units, else ``fp32``
  (:func:`~attncnn.perf.precision.resolve_precision`); a resumed run keeps its own (its first
  segment's in ``machine.json``, or an older run's ``config.json`` ``"precision"``), except that
  ``bf16`` runs in ``fp32`` where bf16 is slow, and an explicit ``--precision`` wins
  (:func:`~attncnn.perf.precision.machine_precision`);
* deterministic: off for a new run unless asked; a resumed run runs as its last segment ran (or as
  an older run's ``config.json`` says) unless ``--deterministic`` / ``--no-deterministic`` says;
* attention paths: where ``--impl`` is not given, the fastest training and test-pass paths of one
  of the run's layers, measured here or read from the machine's cache (:mod:`attncnn.perf.paths`);
  a resumed run chooses again the same way (on its machine, the cached choice), whatever another
  machine chose;
* compile: where ``--compile`` is not given, whether a compiled step pays back its warm-up within
  the run, measured or cached (:mod:`attncnn.perf.compiling`), for a resumed run too.

Compiled and eager steps, and every attention path, compute the same function up to rounding;
bit-identical continuation is promised only on one machine, deterministic, with the same paths
(which ``--deterministic`` fixes to the layers' own rule). The device of a resumed run is this
command's ``--device`` (``auto`` by default), whatever machine started it. Under torchrun nothing
is measured (each process would time its own share of the machine): paths stay as given and
compile stays off unless asked.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from .._typecheck import check_options
from ..models import preset_model_config
from ..runs import TrainConfig
from ..runs.loading import check_options_take_images, resumable_recipe
from ..runs.machine_file import last_segment, run_precision
from ..training import Distributed, RunOptions, RunPlan
from ..training.components import fitted_to_images, make_loaders, resolve_device
from ..training.distributed import launch_from_env, rank_device
from .compiling import with_compile_choice
from .machine import machine_info
from .paths import with_measured_paths
from .precision import machine_precision, resolve_precision

__all__ = ["make_plan", "resume_plan", "plan_device", "PlannedRun"]

log = logging.getLogger(__name__)


def plan_device(device: str, *, source: str | None = None) -> torch.device:
    """This process's device for the ``--device`` value ``device`` (under torchrun: its own GPU);
    ``source`` names where a stored value came from (:func:`resolve_device`).

    Raises:
        ValueError: no device (``gpu``), or one this machine lacks (:func:`resolve_device`); under
            torchrun, see :func:`~attncnn.training.distributed.rank_device`.
    """
    launch = launch_from_env()
    here = resolve_device(device, source=source)    # under torchrun too: rank_device's parse names no option
    return here if launch is None else rank_device(device, launch.local_rank)


@dataclass(frozen=True)
class PlannedRun:
    """A run as the timing functions (:func:`~attncnn.perf.paths.with_measured_paths`,
    :func:`~attncnn.perf.compiling.with_compile_choice`) read it while its plan is made: the
    run-time choices made so far, with the recipe's own fields (``preset``, ``epochs``,
    ``optimizer``, ...) read through from ``recipe``. Not stored anywhere.

    Attributes:
        recipe: the run's :class:`~attncnn.runs.TrainConfig`.
        model: the recipe's model options with the attention paths chosen so far (``impl``, ``eval_impl``).
        precision: ``"fp32"`` or ``"bf16"`` (resolved).
        compile: True, False, or None (not decided yet).
        deterministic, measure_paths, data_dir, download: as :class:`~attncnn.training.RunOptions`.
    """

    recipe: TrainConfig
    model: dict
    precision: str = "fp32"
    compile: bool | None = None
    deterministic: bool = False
    measure_paths: bool = True
    data_dir: str | None = None
    download: bool = False

    @classmethod
    def of(cls, recipe: TrainConfig, options: RunOptions | None = None, *, precision: str = "fp32",
           deterministic: bool | None = None) -> "PlannedRun":
        """The run of ``recipe`` with the run-time ``options`` (default: none given) before anything
        is measured: ``precision`` resolved, ``deterministic`` (None: the options')."""
        options = options or RunOptions()
        return cls(recipe, recipe.model | options.paths(), precision, options.compile,
                   bool(options.deterministic if deterministic is None else deterministic), options.measure_paths,
                   options.data_dir, options.download)

    def replace(self, **changes) -> "PlannedRun":
        """A copy with ``changes``: this run's own fields, or the recipe's (``epochs=5``)."""
        own = {f.name for f in dataclasses.fields(self)}
        recipe = {k: v for k, v in changes.items() if k not in own}
        mine = {k: v for k, v in changes.items() if k in own}
        if recipe:
            mine["recipe"] = dataclasses.replace(self.recipe, **recipe)
        return dataclasses.replace(self, **mine)

    def __getattr__(self, name: str):
        if name == "recipe":        # not set yet (a copy under construction): no recursion
            raise AttributeError(name)
        return getattr(self.recipe, name)


def make_plan(config: TrainConfig, options: RunOptions | None = None) -> RunPlan:
    """The plan of a new run of the recipe ``config`` on this machine, from the run-time
    ``options`` (default: none given; see the module's description).

    Loads the data set when something is to be measured (the image size, class count and steps
    per epoch shape the measurement), so a data set that cannot be read fails here, before the run
    folder exists.

    Raises:
        ValueError: a bad ``device`` or ``precision``; DataError: the data cannot be read.
    """
    options = options or RunOptions()
    device = plan_device(options.device)
    precision = resolve_precision(options.precision or "auto", device)
    return _planned(config, options, device, precision, bool(options.deterministic), new=True)


def resume_plan(folder: str | Path, options: RunOptions | None = None) -> RunPlan:
    """The plan for continuing the run in ``folder`` on this machine (see the module's description).

    Args:
        folder: the run folder (its ``config.json`` and ``machine.json`` are read, not changed).
        options: this command's run-time options (default: none given). Where not given, the
            precision is the run's own (fp32 where bf16 is slow) and ``deterministic`` as its last
            segment ran; an older run's ``config.json`` supplies those and its ``data_dir`` (the
            cache folder its archives were in); device, compile and attention paths are chosen
            here as for a new run.

    Raises:
        RunFolderError: no resumable run in ``folder``. ValueError: a bad device or precision, or an
            older ``config.json``'s machine field of the wrong type (named with the file).
    """
    options = options or RunOptions()
    stored, old = resumable_recipe(folder)            # ``old``: machine fields an older config.json stored
    check_options(old, RunOptions, "training option", source=Path(folder) / "config.json")   # a hand-edited one
    last = last_segment(folder) or {}
    if options.data_dir is None and isinstance(old.get("data_dir"), str):
        options = dataclasses.replace(options, data_dir=old["data_dir"])
    here = plan_device(options.device)
    own = run_precision(folder) or old.get("precision")
    precision = machine_precision(own, here, options.precision, what=f"run {folder}")
    deterministic = options.deterministic
    if deterministic is None:
        deterministic = bool(last.get("deterministic", old.get("deterministic", False)))
        if deterministic:
            log.info("%s: resumed deterministic, as it ran before (--no-deterministic to change)", folder)
    return _planned(stored, options, here, precision, deterministic, new=False)


def _planned(config: TrainConfig, options: RunOptions, device: torch.device, precision: str, deterministic: bool,
             *, new: bool) -> RunPlan:
    """The plan from choices made so far: attention paths and compile measured where left open.

    Raises:
        ValueError: a given attention path the network's layers do not have (their own message).
    """
    preset_model_config(config.preset, **config.model, **options.paths())     # a path the layers lack: now
    trial = _measured(PlannedRun.of(config, options, precision=precision, deterministic=deterministic), device,
                      new=new)
    return RunPlan(device=device, precision=precision, compile=bool(trial.compile), deterministic=deterministic,
                   impl=trial.model.get("impl"), eval_impl=trial.model.get("eval_impl"), options=options,
                   machine=machine_info(device))


def _measured(config: PlannedRun, device: torch.device, *, new: bool) -> PlannedRun:
    """``config`` with the attention paths and the compile decision this machine takes where the
    options leave them open (nothing is measured under torchrun); ``new``: a new run, whose network
    the trainer fits to its images (:func:`~attncnn.training.components.fitted_to_images`)."""
    if launch_from_env() is not None or config.deterministic:
        return dataclasses.replace(config, compile=bool(config.compile))
    dist = Distributed(device=device)
    needs_paths = config.measure_paths and not config.deterministic and "impl" not in config.model
    if not needs_paths and config.compile is not None:
        return config
    dataset, train_loader, _ = make_loaders(config, dist, data_dir=config.data_dir, download=config.download)
    config = for_images(config, dataset, new=new)
    if needs_paths:
        config = with_measured_paths(config, dataset, train_loader.batch_size, dist,
                                     steps=config.epochs * len(train_loader))
    return with_compile_choice(config, dataset, train_loader, dist)


def for_images(config: TrainConfig, dataset, *, new: bool) -> TrainConfig:
    """``config`` as the trainer will build its network for ``dataset``'s images (a
    :class:`~attncnn.data.Dataset` or its :class:`~attncnn.data.DataShape`; a new run:
    :func:`~attncnn.training.components.fitted_to_images`), checked to take them, so that images the
    network refuses fail here with its own message and fix rather than inside a timing (where the
    compile probe would take any error for a compiler failure).

    Raises:
        ValueError: the network refuses the images (:func:`~attncnn.runs.loading.check_images`).
    """
    if new:
        config = fitted_to_images(config, dataset)
    source = f"preset {config.preset} with model options {config.model}"
    check_options_take_images(*preset_model_config(config.preset, dataset.num_classes, **config.model),
                              dataset.image_shape, source)
    return config
