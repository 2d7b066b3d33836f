"""Making a run's plan for the machine at hand: :func:`make_plan` for a new run, :func:`resume_plan`
for a run continued here.

The plan (:class:`attncnn.training.RunPlan`) holds every choice that depends on the machine rather
than on the experiment, made from the recipe (:class:`~attncnn.runs.TrainConfig`) and the run-time
options (:class:`attncnn.training.RunOptions`) before anything is loaded; the paths and compile are
left to a :class:`RunChooser`, which the training loop calls on its real objects and records in
``machine.json`` (never in ``config.json``):

* precision: ``auto`` becomes ``bf16`` where the device has fast bf16 units, else ``fp32``; a
  resumed run keeps its own, except ``bf16`` where bf16 is slow; ``--precision`` wins
  (:func:`~attncnn.perf.precision.machine_precision`);
* deterministic: off for a new run unless asked; a resumed run runs as its last segment ran unless
  ``--deterministic`` / ``--no-deterministic`` says;
* attention paths and compile: the written rule (:func:`attncnn.perf.rule.choose`) where not given;
  ``--impl measure`` and ``--measure-compile`` time the candidates instead (:mod:`attncnn.perf.measure`),
  not under torchrun (each process would time its own share of the machine). Deterministic runs and
  runs under torchrun never compile unless asked (``--compile-mode``: :func:`check_compile_mode`);
* the optimizer's kernel: ``--fused-optimizer`` or not, as given.

Compiled and eager steps, and every attention path, compute the same function up to rounding;
bit-identical continuation is promised on one machine, deterministic, with the same paths. A resumed
run trains on this command's ``--device``, whatever machine started it; one whose ``machine.json``
names a path this version no longer has continues on the rule's path, with one log line saying so.
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
from ..layers import ATTENTION_LAYERS, attention_modules
from ..runs.config import PATH_OPTIONS, PRECISIONS
from ..runs.machine_file import MACHINE_FILE, last_segment, recorded_precision, run_precision
from ..training import Choices, RunOptions, RunParts, RunPlan
from ..training.choices import use_paths
from ..training.components import fitted_to_images, resolve_device
from ..training.distributed import launch_from_env, rank_device
from .machine import machine_info
from .measure import kept_state, measure_compile, measure_paths
from .precision import machine_precision, resolve_precision
from .rule import choose, device_kind

__all__ = ["make_plan", "resume_plan", "plan_device", "for_images", "check_compile_mode", "RunChooser",
           "KNOWN_PATHS"]

#: every computation path some attention layer has ("auto" is the layers' own rule)
KNOWN_PATHS = frozenset(i for kind, cls in ATTENTION_LAYERS.items() for i in cls.impls_of(kind))
#: paths earlier versions had and this one does not (no measurement found them fastest anywhere):
#: a run that trained on one resumes on the rule's path, which computes the same function
REMOVED_PATHS = frozenset({"flex", "sdpa-onehot", "sdpa-bilinear"})

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
    """The plan of a new run of the recipe ``config`` on this machine, from the run-time ``options``
    (default: none given; see the module's description). Loads no data and builds no model.

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
            segment ran (an older run's ``config.json`` supplies those and its ``data_dir``); device,
            compile and paths are chosen here as for a new run.

    Raises:
        RunFolderError: no resumable run in ``folder``. ValueError: a bad device or precision, or an
            older ``config.json``'s machine field of the wrong type (named with the file).
        InputError: a compile mode this device or ``compile`` option cannot take (:func:`check_compile_mode`).
    """
    options = options or RunOptions()
    stored, old = resumable_recipe(folder)            # ``old``: machine fields an older config.json stored
    old.pop("measure_paths", None)                    # an option of the measured choices this version dropped
    _log_removed_paths(folder, old)
    paths = {k: old.pop(k) for k in ("impl", "eval_impl") if k in old}    # never reused: the rule decides
    check_options(old, RunOptions, "training option", source=Path(folder) / "config.json")   # a hand-edited one
    last = last_segment(folder) or {}
    if options.data_dir is None and isinstance(old.get("data_dir"), str):
        options = dataclasses.replace(options, data_dir=old["data_dir"])
    here = plan_device(options.device)
    check_compile_mode(options, here)
    own = run_precision(folder) or old.get("precision")
    precision = machine_precision(own, here, options.precision, what=f"run {folder}")
    _say_unknown_values(folder, {**old, **paths}, precision)
    deterministic = options.deterministic
    if deterministic is None:
        deterministic = bool(last.get("deterministic", old.get("deterministic", False)))
        if deterministic:
            log.info("%s: resumed deterministic, as it ran before (--no-deterministic to change)", folder)
    return _planned(stored, options, here, precision, deterministic)


def _say_unknown_values(folder: str | Path, old: dict, precision: str) -> None:
    """One warning per file naming the values a resume passes over because attncnn does not know them:
    a precision in ``machine.json`` or an older ``config.json`` (``old``: its machine fields), or an
    attention path in the latter."""
    recorded = recorded_precision(folder)
    if recorded is not None and recorded not in ("fp32", "bf16"):
        log.warning("%s records precision %r, which attncnn does not know: ignored, resuming in %s",
                    Path(folder) / MACHINE_FILE, recorded, precision)
    unknown = []
    if old.get("precision") is not None and old["precision"] not in PRECISIONS:
        unknown.append(f"precision {old['precision']!r} (resuming in {precision})")
    for key in PATH_OPTIONS:
        if old.get(key) is not None and old[key] not in KNOWN_PATHS | REMOVED_PATHS | {"auto"}:
            unknown.append(f"{key} {old[key]!r} (this machine chooses the path; --{key.replace('_', '-')} names one)")
    if unknown:
        log.warning("%s stores values attncnn does not know, ignored: %s", Path(folder) / "config.json",
                    "; ".join(unknown))


def _log_removed_paths(folder: str | Path, old: dict) -> None:
    """One log line where the run's files name an attention path this version no longer has: it
    continues on the rule's (or ``--impl``'s) path, which computes the same function."""
    recorded = (last_segment(folder) or {}).get("attention_paths")
    named = [old.get("impl"), old.get("eval_impl")]
    if isinstance(recorded, dict):
        named += [p for paths in recorded.values() if isinstance(paths, list) for p in paths]
    gone = sorted({p for p in named if isinstance(p, str)} & (REMOVED_PATHS - KNOWN_PATHS))
    if gone:
        log.info("%s: it trained on the attention path %s, which this version no longer has; it continues on the "
                 "path the rule gives (named below), which computes the same function", folder, ", ".join(gone))


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
    """The plan from the choices made so far, with a :class:`RunChooser` for those left open.

    Raises:
        ValueError: a given attention path the network's layers do not have (their own message).
        InputError: ``--impl measure`` / ``--measure-compile`` under torchrun, or with ``--compile``.
    """
    preset_model_config(config.preset, **config.model, **options.paths())     # a path the layers lack: now
    measured = [flag for flag, asked in (("--impl measure", options.impl == "measure"),
                                         ("--eval-impl measure", options.eval_impl == "measure"),
                                         ("--measure-compile", options.measure_compile)) if asked]
    if measured and launch_from_env() is not None:
        raise InputError(f"{measured[0]} times the run's choices in this process, but under torchrun each process "
                         "would time its own share of the machine; drop it (the written rule decides)")
    if options.measure_compile and options.compile is not None:
        raise InputError("--measure-compile times whether to compile, but --compile/--no-compile says already; "
                         "drop one of them")
    graphs = options.compile_mode == "reduce-overhead"        # CUDA graphs: compiled, as asked
    decide_compile = options.compile is None and not graphs
    given = options.paths()
    chooser = RunChooser(impl=_open(options.impl), eval_impl=_open(options.eval_impl, options.impl),
                         compile=("measure" if options.measure_compile else "rule") if decide_compile else None,
                         deterministic=deterministic)
    if (chooser.impl, chooser.eval_impl, chooser.compile) == (None, None, None):
        chooser = None                                        # everything given: nothing to decide
    return RunPlan(device=device, precision=precision,
                   compile=None if decide_compile else bool(options.compile or graphs),
                   compile_mode=options.compile_mode, fused_optimizer=options.fused_optimizer,
                   deterministic=deterministic, impl=given.get("impl"), eval_impl=given.get("eval_impl"),
                   options=options, machine=machine_info(device), choose=chooser)


def _open(given: str | None, train: str | None = None) -> str | None:
    """Who decides a path: ``"rule"`` (not given), ``"measure"`` (``--impl measure``), or None (given).
    The test-pass path follows a given training path (``train``) where it is not given itself."""
    decided = given if given is not None else train
    if decided is None:
        return "rule"
    return "measure" if decided == "measure" else None


@dataclasses.dataclass(frozen=True)
class RunChooser:
    """Decides on a run's real objects what its plan leaves open; called by the loop as
    ``chooser(parts)`` with a :class:`~attncnn.training.RunParts`, before the first step.

    Attributes:
        impl, eval_impl: who decides the training and the test-pass path: ``"rule"``, ``"measure"``
            or None (given; a test-pass path not given follows a given training path).
        compile: who decides compile: ``"rule"``, ``"measure"`` or None (given).
        deterministic: the run is deterministic: the rule never compiles it.
    """

    impl: str | None = "rule"
    eval_impl: str | None = "rule"
    compile: str | None = "rule"
    deterministic: bool = False

    def __call__(self, parts: RunParts) -> Choices:
        """The :class:`~attncnn.training.Choices` for the run of ``parts``; anything measured leaves the
        objects' state as it found it (:func:`~attncnn.perf.measure.kept_state`)."""
        layers = attention_modules(parts.model)
        pooling = getattr(getattr(parts.model, "config", None), "pooling", 1)
        grid = (parts.image_shape[1] // pooling, parts.image_shape[2] // pooling)
        rule = choose(device_kind(parts.device), layers[0].kind if layers else None, grid, parts.precision,
                      parts.steps, batch=parts.batch)
        impl = rule.train_impl if self.impl == "rule" else None
        eval_impl = rule.eval_impl if self.eval_impl == "rule" else None
        compile = None
        if self.compile == "rule":
            compile = rule.compile and not self.deterministic and not parts.distributed
        if "rule" in (self.impl, self.eval_impl, self.compile):
            log.info("the rule (attncnn.perf.rule): %s", rule.source)
        if "measure" in (self.impl, self.eval_impl, self.compile):
            with kept_state(parts.model, parts.optimizer, parts.device):
                measured = measure_paths(parts.model, grid=grid, precision=parts.precision, device=parts.device,
                                         batch=parts.batch if self.impl == "measure" else None,
                                         eval_batch=parts.eval_batch if self.eval_impl == "measure" else None)
                impl = measured[0] or impl
                if self.eval_impl == "measure":
                    eval_impl = measured[1]
                if self.compile == "measure":
                    use_paths(parts.model, impl, eval_impl)       # timed on the paths it will train with
                    compile = measure_compile(parts.model, parts.optimizer, image_shape=parts.image_shape,
                                              num_classes=parts.num_classes, batch=parts.batch,
                                              precision=parts.precision, device=parts.device, steps=parts.steps)
        if impl is None and eval_impl is not None:      # the training path given, the test pass's decided
            impl = getattr(layers[0], "impl", None) if layers else None
        return Choices(impl=impl, eval_impl=None if eval_impl == impl else eval_impl, compile=compile)


def for_images(config: TrainConfig, data) -> TrainConfig:
    """``config`` as the trainer builds a new run's network for ``data``'s images (a
    :class:`~attncnn.data.Dataset` or its :class:`~attncnn.data.DataShape`;
    :func:`~attncnn.training.components.fitted_to_images`), checked to take them; for estimates made
    before a run exists (``attncnn reproduce --dry-run``).

    Raises:
        ValueError: the network refuses the images (:func:`~attncnn.runs.loading.check_images`).
    """
    config = fitted_to_images(config, data)
    source = f"preset {config.preset} with model options {config.model}"
    check_options_take_images(*preset_model_config(config.preset, data.num_classes, **config.model),
                              data.image_shape, source)
    return config
