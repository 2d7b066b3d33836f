"""Making a run's plan for the machine at hand: :func:`make_plan` for a new run, :func:`resume_plan`
for a run continued here.

The plan (:class:`attncnn.training.RunPlan`) holds every choice of a run that depends on the
machine rather than on the experiment: the device, the precision of this segment, the attention
paths and whether to compile. Where the configuration leaves one open, it is decided here, by the
rules of this package, before the training loop starts:

* precision: ``auto`` becomes ``bf16`` where the device has fast bf16 units, else ``fp32``
  (:func:`~attncnn.perf.precision.resolve_precision`); a resumed run keeps its own, except that
  ``bf16`` runs in ``fp32`` where bf16 is slow, and an explicit ``--precision`` wins
  (:func:`~attncnn.perf.precision.machine_precision`);
* attention paths: where the model options leave ``impl`` open, the fastest training and test-pass
  paths of one of the run's layers, measured here or read from the machine's cache
  (:mod:`attncnn.perf.paths`);
* compile: where ``--compile`` is not given, whether a compiled step pays back its warm-up within
  the run, measured or cached (:mod:`attncnn.perf.compiling`).

A resumed run keeps the choices its ``config.json`` recorded, except those its command gives
(``--device``, ``--precision``, ``--compile``: they belong to the machine, not to the experiment,
and compiled and eager steps compute the same function up to rounding), and the rule for runs
that change machines: when the last epoch in ``metrics.jsonl`` names another machine than this one
(``"machine"``, recorded by ``attncnn reproduce``), measured attention paths are measured again here
(every path computes the same function up to rounding; bit-identical continuation is promised only
on one machine). Under torchrun nothing is measured (each process would time its own share of the
machine): paths stay as given and compile stays off unless asked.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from ..models import preset_model_config
from ..runs import RunFolder, TrainConfig, resumable_config
from ..runs.loading import check_options_take_images
from ..training import Distributed, RunPlan
from ..training.components import fitted_to_images, make_loaders, resolve_device
from ..training.distributed import launch_from_env, rank_device
from .compiling import with_compile_choice
from .machine import MACHINE_KEY, epoch_machine
from .paths import with_measured_paths
from .precision import machine_precision, resolve_precision

__all__ = ["make_plan", "resume_plan", "plan_device", "moved_machine"]

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


def make_plan(config: TrainConfig) -> RunPlan:
    """The plan of a new run of ``config`` on this machine (see the module's description).

    Loads the data set when something is to be measured (the image size, class count and steps
    per epoch shape the measurement), so a data set that cannot be read fails here, before the run
    folder exists.

    Raises:
        ValueError: a bad ``device`` or ``precision``; DataError: the data cannot be read.
    """
    device = plan_device(config.device)
    config = dataclasses.replace(config, precision=resolve_precision(config.precision, device))
    config = _measured(config, device, new=True)
    return RunPlan(device=device, precision=config.precision, compile=bool(config.compile),
                   impl=config.model.get("impl"), eval_impl=config.model.get("eval_impl"))


def resume_plan(folder: str | Path, *, device: str | None = None, precision: str | None = None,
                compile: bool | None = None, keep_impl: bool = False) -> RunPlan:
    """The plan for continuing the run in ``folder`` on this machine (see the module's description).

    Args:
        folder: the run folder (its ``config.json`` and ``metrics.jsonl`` are read, not changed).
        device: this command's ``--device`` (None: the run's own); recorded for the rest of the run.
        precision: this command's ``--precision`` (None: the run's own, or fp32 where bf16 is slow).
        compile: this command's ``--compile`` or ``--no-compile`` (None: the run's own); a machine's
            choice like the precision, so ``config.json`` keeps the run's own and each epoch record
            says whether a compiled step trained it (``"compiled"``).
        keep_impl: keep the recorded attention paths even on another machine (a study that names them).

    Raises:
        RunFolderError: no resumable run in ``folder``. ValueError: a bad device or precision (a bad
            device stored in ``config.json``, without ``--device``, is named with the file).
    """
    stored = resumable_config(folder)
    here = (plan_device(device) if device is not None else
            plan_device(stored.device, source=f"run {folder}: config.json's device {stored.device!r}"))
    run_precision = machine_precision(stored.precision, here, precision, what=f"run {folder}")
    config = dataclasses.replace(stored, precision=run_precision,
                                 compile=stored.compile if compile is None else compile)
    changes = [] if device is None or device == stored.device else [f"device {stored.device!r} -> {device!r}"]
    if not keep_impl and moved_machine(folder, stored, here):
        changes.append(f"attention path {stored.model['impl']!r} -> measured again here")
        config = dataclasses.replace(config, model={k: v for k, v in stored.model.items()
                                                    if k not in ("impl", "eval_impl")})
    if changes:
        log.info("%s: resumed on another machine: %s", folder, "; ".join(changes))
    config = _measured(config, here, new=False)
    return RunPlan(device=here, precision=run_precision, compile=bool(config.compile),
                   impl=config.model.get("impl"), eval_impl=config.model.get("eval_impl"),
                   device_option=device if device is not None and device != stored.device else None)


def moved_machine(folder: str | Path, stored: TrainConfig, device: torch.device) -> bool:
    """True when the run measured its attention path (``measure_paths`` on, not ``deterministic``,
    an ``impl`` recorded) and its last epoch that names a machine ran on another one than this."""
    if not stored.measure_paths or stored.deterministic or "impl" not in stored.model:
        return False
    records = [r for r in RunFolder(folder, mode="read").read_metrics() if isinstance(r.get(MACHINE_KEY), dict)]
    return bool(records) and records[-1][MACHINE_KEY] != epoch_machine(device)


def _measured(config: TrainConfig, device: torch.device, *, new: bool) -> TrainConfig:
    """``config`` with the attention paths and the compile decision this machine takes where the
    options leave them open (nothing is measured under torchrun); ``new``: a new run, whose network
    the trainer fits to its images (:func:`~attncnn.training.components.fitted_to_images`)."""
    if launch_from_env() is not None or config.deterministic:
        return dataclasses.replace(config, compile=bool(config.compile))
    dist = Distributed(device=device)
    needs_paths = config.measure_paths and not config.deterministic and "impl" not in config.model
    if not needs_paths and config.compile is not None:
        return config
    dataset, train_loader, _ = make_loaders(config, dist)
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
