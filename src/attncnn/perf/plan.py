"""Making a run's plan for the machine at hand: :func:`make_plan` for a new run, :func:`resume_plan`
for a run continued here.

The plan (:class:`attncnn.training.RunPlan`) holds every choice of a run that depends on the
machine rather than on the experiment: the device, the precision of this segment, the attention
paths, whether to compile and to run deterministically. It is made from the recipe
(:class:`~attncnn.runs.TrainConfig`) and the run-time options (:class:`attncnn.training.RunOptions`,
the command's flags). What needs neither the data nor a network is decided here, and cheap
mistakes are found here, before anything is loaded (a bad device or precision, a given attention
path the network's layers lack); what must be measured on the run's network is left to a
:class:`~attncnn.perf.choosing.RunChooser` in the plan, which the training loop calls on its real
model, optimizer and batch shapes before the first step. Nothing here loads the data set or builds
a model, and nothing of the plan is written into ``config.json`` (the loop records the decided
plan in ``machine.json``):

* precision: ``auto`` becomes ``bf16`` where the device has fast bf16 units, else ``fp32``
  (:func:`~attncnn.perf.precision.resolve_precision`); a resumed run keeps its own (its first
  segment's in ``machine.json``, or an older run's ``config.json`` ``"precision"``), except that
  ``bf16`` runs in ``fp32`` where bf16 is slow, and an explicit ``--precision`` wins
  (:func:`~attncnn.perf.precision.machine_precision`);
* deterministic: off for a new run unless asked; a resumed run runs as its last segment ran (or as
  an older run's ``config.json`` says) unless ``--deterministic`` / ``--no-deterministic`` says;
* attention paths: where ``--impl`` is not given (and paths are measured), the chooser times the
  training and test-pass paths of one of the run's layers, or reads them from the machine's cache
  (:mod:`attncnn.perf.paths`); a resumed run chooses again the same way (on its machine, the
  cached choice), whatever another machine chose;
* compile: where ``--compile`` is not given, the chooser decides whether a compiled step pays back
  its warm-up within the run, measured or cached (:mod:`attncnn.perf.compiling`), for a resumed run
  too. ``--compile-mode reduce-overhead`` (CUDA graphs) compiles without that probe: the probe times
  the default mode, whose answer says nothing of a step whose cost is its kernel launches, and a
  run asks for CUDA graphs to train compiled. It is refused off CUDA (CUDA graphs are CUDA's) and
  with ``--no-compile`` (:func:`check_compile_mode`); like every option here it is this segment's
  (a resumed run compiles as its own command says);
* the optimizer's kernel: ``--fused-optimizer`` or not, as given (no measurement).

Compiled and eager steps, and every attention path, compute the same function up to rounding;
bit-identical continuation is promised only on one machine, deterministic, with the same paths
(which ``--deterministic`` fixes to the layers' own rule). The device of a resumed run is this
command's ``--device`` (``auto`` by default), whatever machine started it. Deterministic runs, and
runs under torchrun, measure nothing (each process would time its own share of the machine): they
get no chooser, paths stay as given and compile stays off unless asked.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from .._typecheck import check_options
from ..errors import InputError
from ..models import preset_model_config
from ..runs import TrainConfig
from ..runs.loading import check_options_take_images, resumable_recipe
from ..runs.config import PATH_OPTIONS, PRECISIONS
from ..runs.machine_file import MACHINE_FILE, last_segment, recorded_precision, run_precision
from ..training import RunOptions, RunPlan
from ..training.components import fitted_to_images, resolve_device
from ..training.distributed import launch_from_env, rank_device
from .choosing import RunChooser
from .machine import machine_info
from .paths import _KNOWN_PATHS
from .precision import machine_precision, resolve_precision

__all__ = ["make_plan", "resume_plan", "plan_device", "for_images", "check_compile_mode"]

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


def make_plan(config: TrainConfig, options: RunOptions | None = None) -> RunPlan:
    """The plan of a new run of the recipe ``config`` on this machine, from the run-time
    ``options`` (default: none given; see the module's description). Loads no data and builds no
    model: what is measured is measured by the plan's chooser inside the training call.

    Raises:
        ValueError: a bad ``device`` or ``precision``, or a given attention path the network's
            layers do not have (their own message).
        InputError: a compile mode this device or ``compile`` option cannot take (:func:`check_compile_mode`).
    """
    options = options or RunOptions()
    device = plan_device(options.device)
    check_compile_mode(options, device)
    precision = resolve_precision(options.precision or "auto", device)
    return _planned(config, options, device, precision, bool(options.deterministic))


def resume_plan(folder: str | Path, options: RunOptions | None = None) -> RunPlan:
    """The plan for continuing the run in ``folder`` on this machine (see the module's description).

    Args:
        folder: the run folder (its ``config.json`` and ``machine.json`` are read, not changed).
        options: this command's run-time options (default: none given). Where not given, the
            precision is the run's own (fp32 where bf16 is slow) and ``deterministic`` as its last
            segment ran; an older run's ``config.json`` supplies those and its ``data_dir`` (the
            cache folder its archives were in); device, compile and attention paths are chosen
            on this machine as for a new run (compile and paths by the plan's chooser, when the
            loop has rebuilt the run).

    Raises:
        RunFolderError: no resumable run in ``folder``. ValueError: a bad device or precision, or an
            older ``config.json``'s machine field of the wrong type (named with the file).
        InputError: a compile mode this device or ``compile`` option cannot take (:func:`check_compile_mode`).
    """
    options = options or RunOptions()
    stored, old = resumable_recipe(folder)            # ``old``: machine fields an older config.json stored
    check_options(old, RunOptions, "training option", source=Path(folder) / "config.json")   # a hand-edited one
    last = last_segment(folder) or {}
    if options.data_dir is None and isinstance(old.get("data_dir"), str):
        options = dataclasses.replace(options, data_dir=old["data_dir"])
    here = plan_device(options.device)
    check_compile_mode(options, here)
    own = run_precision(folder) or old.get("precision")
    precision = machine_precision(own, here, options.precision, what=f"run {folder}")
    _say_unknown_values(folder, old, precision)
    deterministic = options.deterministic
    if deterministic is None:
        deterministic = bool(last.get("deterministic", old.get("deterministic", False)))
        if deterministic:
            log.info("%s: resumed deterministic, as it ran before (--no-deterministic to change)", folder)
    return _planned(stored, options, here, precision, deterministic)


def _say_unknown_values(folder: str | Path, old: dict, precision: str) -> None:
    """One warning per file naming the values a resume passes over because attncnn does not know them:
    a precision in ``machine.json`` or in an older ``config.json`` (``old``: its machine fields), an
    attention path in the latter (a hand-edited ``"fp8"`` or ``"warp"``). Known paths an older
    ``config.json`` stored are passed over by design (this machine chooses its paths) and not named."""
    recorded = recorded_precision(folder)
    if recorded is not None and recorded not in ("fp32", "bf16"):
        log.warning("%s records precision %r, which attncnn does not know: ignored, resuming in %s",
                    Path(folder) / MACHINE_FILE, recorded, precision)
    unknown = []
    if old.get("precision") is not None and old["precision"] not in PRECISIONS:
        unknown.append(f"precision {old['precision']!r} (resuming in {precision})")
    for key in PATH_OPTIONS:
        if old.get(key) is not None and old[key] not in _KNOWN_PATHS | {"auto"}:
            unknown.append(f"{key} {old[key]!r} (this machine chooses the path; --{key.replace('_', '-')} names one)")
    if unknown:
        log.warning("%s stores values attncnn does not know, ignored: %s", Path(folder) / "config.json",
                    "; ".join(unknown))


def check_compile_mode(options: RunOptions, device: torch.device) -> None:
    """Refuse a ``compile_mode`` the run cannot take: ``"reduce-overhead"`` replays CUDA graphs, so
    it needs a CUDA ``device`` (the one resolved from ``--device``) and a compiled step.

    Raises:
        InputError: ``"reduce-overhead"`` with ``compile`` False, or on a device other than CUDA;
            the message names the fix.
    """
    if options.compile_mode != "reduce-overhead":
        return
    if options.compile is False:
        raise InputError("--compile-mode reduce-overhead compiles the training step, but --no-compile says not to; "
                         "drop one of them")
    if device.type != "cuda":
        raise InputError(f"--compile-mode reduce-overhead replays CUDA graphs, which only CUDA has, but this run "
                         f"trains on {device}; drop --compile-mode (or train with --device cuda on a GPU)")


def _planned(config: TrainConfig, options: RunOptions, device: torch.device, precision: str,
             deterministic: bool) -> RunPlan:
    """The plan from the choices made so far, with a :class:`~attncnn.perf.choosing.RunChooser`
    for those left open (none for a deterministic run or under torchrun: nothing is measured).

    Raises:
        ValueError: a given attention path the network's layers do not have (their own message).
    """
    preset_model_config(config.preset, **config.model, **options.paths())     # a path the layers lack: now
    measures = launch_from_env() is None and not deterministic
    paths = measures and options.measure_paths and options.impl is None
    graphs = options.compile_mode == "reduce-overhead"        # compiles, unprobed (module docstring)
    compile = measures and options.compile is None and not graphs
    chooser = (RunChooser(paths=paths, eval_path=paths and options.eval_impl is None, compile=compile,
                          given=options.paths()) if paths or compile else None)
    return RunPlan(device=device, precision=precision, compile=None if compile else bool(options.compile or graphs),
                   compile_mode=options.compile_mode, fused_optimizer=options.fused_optimizer,
                   deterministic=deterministic, impl=options.impl, eval_impl=options.eval_impl, options=options,
                   machine=machine_info(device), choose=chooser)


def for_images(config: TrainConfig, data) -> TrainConfig:
    """``config`` as the trainer builds a new run's network for ``data``'s images (a
    :class:`~attncnn.data.Dataset` or its :class:`~attncnn.data.DataShape`;
    :func:`~attncnn.training.components.fitted_to_images`), checked to take them, so that images the
    network refuses fail with its own message and fix. Not used by the plans (they load no data):
    it stays here for the estimates made before a run exists (``attncnn reproduce --dry-run``,
    whose run shape must be the one the trainer records in the compile cache).

    Raises:
        ValueError: the network refuses the images (:func:`~attncnn.runs.loading.check_images`).
    """
    config = fitted_to_images(config, data)
    source = f"preset {config.preset} with model options {config.model}"
    check_options_take_images(*preset_model_config(config.preset, data.num_classes, **config.model),
                              data.image_shape, source)
    return config
