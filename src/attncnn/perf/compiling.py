"""Whether a run compiles its model (``--compile`` not given): measured on the run's own model and
optimizer on the device it trains on, cached, and chosen wherever the compilation pays for itself
within the run.

``torch.compile`` fuses the elementwise work around the matrix products (softmax, the positional
term, LayerNorm, GELU), which is most of what content attention's ``(B, N_h, N, N)`` scores and a
small ResNet spend their time on, but it costs a warm-up (tracing and code generation, seconds to
minutes) and on some models it gains little or nothing (docs/speed.md). So a run whose options
leave ``compile`` unset times its own training step inside the training call, on its real network
and optimizer (their state put back afterwards by :class:`attncnn.perf.choosing.RunChooser`) with
random inputs of its batch's shape, at its precision (:func:`time_compile`): eager first, then the
compiled step (``torch.compile(model, dynamic=False)``, as the loop compiles; its first call is the
warm-up) in three alternated rounds. The run compiles (:func:`pays_back`) when compiled is at least
:data:`MIN_SPEEDUP` times faster (a margin for what a probe of a few steps cannot see: inside the
trainer a compiled model can gain less than its probe said; benchmarks/results/HISTORY.md) and the
seconds it saves over the run's steps exceed the measured warm-up. There is no fixed minimum run
length: a 3-minute GPU run whose compilation takes 30 s and saves 70 compiles. Nothing resets
dynamo: where compiling wins, the loop's own ``torch.compile`` of the same module finds the probe's
compiled code in dynamo's cache, so the warm-up is not paid twice; a caller's own compiled
functions are left alone.

The probe's compilation is itself a warm-up, wasted when the answer is "eager". It is skipped,
after the probe's first step or after its eager timing, where the rest of the probe would take
longer than the whole run trains eager: :func:`warmup_floor`, the shortest warm-up this machine has shown (the smallest
recorded in its cache for any run shape, or, with none recorded yet, the first compilation of a
one-operation function on the device, measured once per process: every compiled training step does
at least that work), plus the probe's own further steps (after the first step: 2 eager steps and
:func:`probe_steps`; after the eager timing: :func:`probe_steps`; each taken as long as an eager
one). Then no compilation could pay back within the run, since even a compiled step of
no time saves at most the run's eager time; so a smoke run of a few steps of a large model does not
spend a minute timing a compiler it cannot use.

The three timings are cached as typed ``"compile"`` records (:mod:`attncnn.perf.cache`) keyed by the
machine (:func:`~attncnn.perf.machine.machine_record`) and the run (:func:`compile_run`: preset,
model options with the attention paths taken, optimizer and its fused kernel where taken,
per-process batch, image size, precision), so the next run on this machine decides from them without
measuring, by the same rule: for a given cache the choice is deterministic. A timing taken while
other work shares the CPU (:func:`~attncnn.perf.machine.busy_reason`) decides this run only and is
not cached. A record that is not three such timings (:func:`timing_problem`: an edited or damaged
file) is dropped with a warning naming the file and measured again. The decision goes into the run's
plan and its ``machine.json`` segment, never its recipe (``config.json``): a resumed run decides
again, from the same cache on the same machine. Runs with ``--deterministic`` or under torchrun
never compile unless asked (``--compile``): their numbers must not depend on timing, and several
processes would each time their own share of the machine. The probe times ``torch.compile``'s
default mode only: ``--compile-mode reduce-overhead`` (CUDA graphs) compiles without asking it
(:mod:`attncnn.perf.plan`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics

import torch

from ..runs import TrainConfig
from ..training.step import training_step
from .cache import find_record, read_records, typed, write_record
from .machine import busy_reason, machine_record
from .timing import seconds, time_alternated

__all__ = ["CHOICE", "MIN_SPEEDUP", "CompileTiming", "probe_steps", "time_compile", "pays_back", "warmup_floor",
           "compile_run", "timing_problem", "choose_compile", "cached_timing"]

log = logging.getLogger(__name__)

#: the ``choice`` of this module's cache records
CHOICE = "compile"
#: compiled must be at least this much faster than eager, per step, to be chosen
MIN_SPEEDUP = 1.10


@dataclasses.dataclass(frozen=True)
class CompileTiming:
    """Seconds of one training step (forward, loss, backward, optimizer step) of the same network.

    Attributes:
        eager: median of the eager steps.
        compiled: median of the compiled steps, after the warm-up (``None``: not measured).
        warmup: seconds of the first compiled step: tracing and code generation (``None``: not measured).
    """

    eager: float
    compiled: float | None = None
    warmup: float | None = None

    @property
    def speedup(self) -> float | None:
        """``eager / compiled``: above 1 when the compiled step is faster."""
        return None if self.compiled is None else self.eager / self.compiled


def pays_back(timing: CompileTiming, steps: int, *, min_speedup: float = MIN_SPEEDUP) -> bool:
    """Whether compiling saves time over a run of ``steps`` training steps: compiled at least
    ``min_speedup`` times faster per step, and the seconds saved over the run larger than the warm-up.

    The trainer's rule, applied alike to a measurement and to a cached one, so that a run's decision
    does not depend on whether it measured. A timing without a compiled step (the probe stopped
    early) means eager (False)."""
    if timing.compiled is None or timing.warmup is None:
        return False
    return timing.eager >= min_speedup * timing.compiled and (timing.eager - timing.compiled) * steps > timing.warmup


#: first-compilation seconds of a one-operation function, per device, measured once per process
_FIRST_COMPILE: dict[str, float] = {}


def warmup_floor(device: torch.device, records: list[dict] | None = None) -> tuple[float, str]:
    """The shortest warm-up a compilation shows on this machine, in seconds, and where it comes from.

    Args:
        device: where the run trains.
        records: the cache's ``"compile"`` records (:func:`~attncnn.perf.cache.read_records`), or None.

    Returns:
        ``(seconds, source)``: the smallest ``warmup`` among ``records`` of this machine
        (:func:`~attncnn.perf.machine.machine_record`), any run shape; with none recorded, the
        first call of ``torch.compile`` on a one-operation function on ``device``, measured once per
        process and device (tracing, code generation and a compiler run: work every compiled
        training step also does).

    Raises:
        whatever ``torch.compile`` raises on this machine (e.g. no C++ compiler for inductor on a CPU).
    """
    here = typed(machine_record(device))
    recorded = [r["value"]["warmup"] for r in records or () if r["machine"] == here]
    if recorded:
        return min(recorded), "the shortest compilation recorded on this machine"
    name = str(device)
    if name not in _FIRST_COMPILE:
        probe = torch.compile(lambda t: t * 2 + 1, dynamic=False)
        x = torch.ones(8, device=device)
        _FIRST_COMPILE[name] = seconds(lambda: probe(x), device)
    return _FIRST_COMPILE[name], "a one-operation compilation, measured now"


def probe_steps(reps: int = 3) -> int:
    """Training steps :func:`time_compile` takes after its eager ones when it goes on to compile:
    the second compiled step and ``reps`` alternated steps of each mode (the warm-up step aside)."""
    return 1 + 2 * reps


def time_compile(model: torch.nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
                 labels: torch.Tensor, *, precision: str, min_run_seconds: float = 0.0, steps: int | None = None,
                 reps: int = 3) -> CompileTiming:
    """Time training steps of ``model`` eager and compiled (``torch.compile(model, dynamic=False)``,
    as the trainer compiles), alternated, on one batch. The model's weights, buffers, gradients and
    the optimizer's state change (the optimizer steps): give it a copy, or put them back afterwards
    (:class:`~attncnn.perf.choosing.RunChooser`). The compiled code stays in dynamo's cache (no
    reset): the trainer's own compilation of the same module reuses it.

    Args:
        model: the network in training mode, on the batch's device. optimizer: over its parameters.
        images: ``(B, C, H, W)`` float32. labels: ``(B,)`` class indices.
        precision: ``"fp32"`` or ``"bf16"`` (autocast, as the trainer runs).
        min_run_seconds, steps: the run's warm-up floor and length in steps (None: no run, always
            compile); when the eager step times ``steps`` is under ``min_run_seconds`` plus the
            eager step times the steps left in this probe (what the rest of it would take), stop
            there, nothing compiled: after the first step (its time standing for the step's; left:
            2 eager steps and :func:`probe_steps`), else after the eager timing (left:
            :func:`probe_steps`).
        reps: timed steps per mode after the warm-up.

    Returns:
        The :class:`CompileTiming` (``compiled`` and ``warmup`` None when stopped early).

    Raises:
        whatever ``torch.compile`` raises on this machine (e.g. no C++ compiler for inductor on a CPU).
    """
    device = images.device

    def call(net):
        return lambda: training_step(net, optimizer, images, labels, precision)

    def step(net) -> float:
        return seconds(call(net), device)

    first = step(model)                             # first touch of every buffer, kernel choices
    # the same test at each point the probe can stop: does the rest of it outlast the run? Here the
    # rest includes the two eager steps that time the step (a 2-step run of a large model spent more
    # on them than on its training)
    if steps is not None and first * steps < min_run_seconds + first * (2 + probe_steps(reps)):
        return CompileTiming(eager=first)
    eager = statistics.median(step(model) for _ in range(2))
    if steps is not None and eager * steps < min_run_seconds + eager * probe_steps(reps):
        return CompileTiming(eager=eager)
    compiled_model = torch.compile(model, dynamic=False)
    # the compilation is the probe's longest step (44 s for the demo on a 2-core CPU): say what the wait is
    log.info("compile: compiling the training step to time it%s...", f" (at least {min_run_seconds:.0f} s here)"
             if min_run_seconds >= 1 else "")
    warmup = step(compiled_model)
    step(compiled_model)
    # alternated: a busy machine slows both alike
    timed = time_alternated({"eager": call(model), "compiled": call(compiled_model)}, device, reps=reps, warmup=0,
                            what="the training step eager and compiled")
    return CompileTiming(eager=timed["eager"], compiled=timed["compiled"], warmup=warmup)


_TIMED = ("eager", "compiled", "warmup")


def timing_problem(run: dict, value) -> str | None:
    """What is wrong with a cached compile record (None: nothing): its value must be an object
    whose ``eager``, ``compiled`` and ``warmup`` are finite seconds, the first two above 0 (the
    speed-up is their ratio), as :func:`choose_compile` writes it."""
    if not isinstance(value, dict):
        return f"a timing must be an object of {', '.join(_TIMED)} seconds, got {value!r}"
    for name in _TIMED:
        if name not in value:
            return f"it has no {name!r} seconds"
        seconds = value[name]
        if (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds)
                or seconds < 0 or (seconds == 0 and name != "warmup")):
            return f"{name!r} must be a positive number of seconds, got {seconds!r}"
    return None


def compile_run(config: TrainConfig, model: dict, *, batch: int, image_size: tuple[int, int], precision: str,
                fused_optimizer: bool = False) -> dict:
    """The typed ``run`` field of a compile record: what a training step's cost depends on,
    ``{"preset", "model", "optimizer", "image", "batch", "precision"}`` (``model``: the model
    options the network is built with, its attention paths included; ``batch``: per process), and
    ``"fused_optimizer": true`` for a run whose optimizer takes its fused kernel (absent otherwise,
    so that the records of the foreach kernels written before that option existed still serve)."""
    return typed({"preset": config.preset, "model": model, "optimizer": config.optimizer,
                  "image": list(image_size), "batch": batch, "precision": precision,
                  **({"fused_optimizer": True} if fused_optimizer else {})})


_PATHS = ("impl", "eval_impl")


def cached_timing(config: TrainConfig, *, batch: int, image_size: tuple[int, int], precision: str,
                  device: torch.device) -> CompileTiming | None:
    """This machine's cached compile measurement of a run shaped like ``config``, whatever attention
    paths it took, or None: for estimates made before a run has chosen its paths (the dry run of
    ``attncnn reproduce``). Among records that differ only in the paths, the fastest eager step is
    taken (the path a run measures and keeps is its fastest)."""
    here = typed(machine_record(device))
    wanted = compile_run(config, {k: v for k, v in config.model.items() if k not in _PATHS}, batch=batch,
                         image_size=image_size, precision=precision)
    found = []
    for record in read_records(CHOICE, timing_problem):
        run = record["run"]
        if record["machine"] != here or not isinstance(run.get("model"), dict):
            continue
        if {**run, "model": {k: v for k, v in run["model"].items() if k not in _PATHS}} == wanted:
            found.append(CompileTiming(**{k: record["value"][k] for k in _TIMED}))
    return min(found, key=lambda t: t.eager) if found else None


def choose_compile(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig, *,
                   model_options: dict, image_shape: tuple[int, int, int], num_classes: int, batch: int,
                   precision: str, device: torch.device, steps: int) -> bool:
    """Whether the run compiles: from this machine's cached timing of its shape, else measured
    (:func:`time_compile`) on ``model`` and ``optimizer`` themselves with random images of
    ``(batch, *image_shape)`` and labels below ``num_classes``, and cached (module docstring).
    The model and optimizer are changed by the probe: the caller puts their state back.

    Args:
        config: the run's recipe (preset, optimizer). model_options: the options the network is
            built with, attention paths included (:func:`compile_run`). steps: the training steps
            the decision is for (:func:`pays_back`).

    Returns:
        True to compile. A compiler that fails here means False, with a warning.
    """
    image_size = tuple(image_shape[1:])
    machine = machine_record(device)
    fused = any(group.get("fused") for group in optimizer.param_groups)       # --fused-optimizer
    run = compile_run(config, model_options, batch=batch, image_size=image_size, precision=precision,
                      fused_optimizer=fused)
    cached = find_record(CHOICE, machine, run, timing_problem)
    if cached is not None:
        timing = CompileTiming(**{k: cached[k] for k in _TIMED})
        source = "cached for this machine and run shape"
    else:
        busy = busy_reason(device)         # sampled before the probe's own threads load the CPU
        try:
            floor = warmup_floor(device, read_records(CHOICE, timing_problem))
            images = torch.randn(batch, *image_shape, device=device)
            labels = torch.randint(0, num_classes, (batch,), device=device)
            was = model.training
            model.train()
            try:
                timing = time_compile(model, optimizer, images, labels, precision=precision,
                                      min_run_seconds=floor[0], steps=steps)
            finally:
                model.train(was)
        except Exception as err:        # noqa: BLE001 - any compiler failure means: train eager
            log.warning("torch.compile failed on this machine, training without it (%s: %s)",
                        type(err).__name__, str(err).splitlines()[0] if str(err) else "")
            return False
        if timing.compiled is None:
            log.info("compile: off (the run's %d steps take about %.1f s eager here, less than timing a compilation "
                     "would: %.1f s to compile, %s, and up to %d more steps; --compile compiles anyway)", steps,
                     timing.eager * steps, *floor, 2 + probe_steps())
            return False
        if busy is None:
            write_record(CHOICE, machine, run, dataclasses.asdict(timing), timing_problem)
        else:
            log.info("compile: measured while %s: the choice serves this run and is not cached (the next run "
                     "measures again)", busy)
        source = "measured on this run's network and optimizer"
    decision = pays_back(timing, steps)
    _log(decision, timing, steps, source)
    return decision


def _log(decision: bool, timing: CompileTiming, steps: int, source: str) -> None:
    log.info("compile: %s (%s: a training step %.0f ms eager, %.0f ms compiled, %.2fx; warm-up %.1f s, paid "
             "once in the first step; %d steps save about %.0f s)", "on" if decision else "off", source,
             1e3 * timing.eager, 1e3 * timing.compiled, timing.speedup, timing.warmup, steps,
             (timing.eager - timing.compiled) * steps)
