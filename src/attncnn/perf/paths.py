"""Which computation path (``impl``) a run's attention layers take: measured on this machine, cached.

Every path of a layer computes the same output up to rounding (tests check each pair), but which
is fastest depends on the machine (CPUs of one family disagree; ``benchmarks/paths.py`` compares
them, docs/speed.md has the figures). So a run whose model options leave ``impl="auto"``
times every path of one of its layers, on its own batch size, grid, precision and device
(:func:`attncnn.perf.timing.time_impls`, a few seconds), and trains with the fastest. A test
pass has no backward, so the forward alone is timed too, in eval mode on the evaluation batch, and
the run evaluates with its own fastest path where that differs (content attention: the fused
kernel stores nothing for a gradient and wins there, while the written-out scores win in training).
The choices go into the run's plan (never its recipe: the run's ``machine.json`` records the paths
each layer took), and are cached in ``attention-paths.json`` in the run's ``--data-dir`` (default
:func:`attncnn.data.default_data_dir`), keyed by CPU model and
generation, thread count, torch version, device, precision, the layer's shape and the mode, so the
next run on this machine, and a resumed one, reuses them without measuring: for a given cache the
choice is deterministic. A cached
entry naming a path the layer does not have (:func:`path_problem`: an edited or damaged file) is
dropped with a warning naming the file and measured again. A choice measured while other work
shares the CPU (:func:`~attncnn.perf.machine.busy_reason`) serves its run but is not cached.

A run too short for the timing to pay back does not time: each path runs once anyway (to find the
paths that run at all), and when even the run's every call of the layer on the slowest of them would
take less than timing :data:`REPS` more calls of each (:func:`timing_pays`), the path fastest in that
one call is taken, and not cached (a smoke run of two steps spent most of its time timing paths).

Runs with ``--deterministic`` never measure (their numbers must not depend on timing); they keep
``"auto"``, the layers' own rule.

Whether to compile is decided afterwards, on the whole training step of the run's network with
the chosen path (:mod:`attncnn.perf.compiling`): a compiler fuses across layers, so one
layer timed alone would not say what it gains.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from pathlib import Path
from typing import NamedTuple

import torch

from ..data import default_data_dir
from ..layers import ATTENTION_LAYERS, build_attention
from ..models import preset_model_config
from ..training import count_test_passes
from .cache import read_cache, write_cache
from .machine import busy_reason, machine_key
from .timing import paths_restored, run_impl, seconds, time_impls

__all__ = ["CACHE_NAME", "REPS", "PathChoice", "path_cache_key", "path_problem", "timing_pays", "choose_impl",
           "with_measured_paths"]

log = logging.getLogger(__name__)

CACHE_NAME = "attention-paths.json"
#: timed calls of each path, alternated across paths: paths within a few per cent of each other (dense
#: and folded on some CPUs) were ordered by noise with 3
REPS = 7
#: every computation path some attention layer has ("auto" is a rule, never a measured choice)
_KNOWN_PATHS = frozenset(i for kind, cls in ATTENTION_LAYERS.items() for i in cls.impls_of(kind)) - {"auto"}
_COMPARED = re.compile(r" paths=(\S+)")


def path_cache_key(model_config, batch: int, grid: tuple[int, int], precision: str, device: torch.device,
                   impls: tuple[str, ...] = ()) -> str:
    """The cache key of a measurement: machine (CPU model or GPU name, threads, torch), the
    layer's kind, shape, dropout, grid, per-process batch, precision, and the paths compared (so
    that a choice made before a new path existed is measured again, not reused)."""
    c = model_config
    shape = (f"{c.attention} dim={c.dim} heads={c.num_heads} head_dim={c.head_dim} attn_drop={c.attn_dropout} "
             f"grid={grid[0]}x{grid[1]} batch={batch} {precision}")
    if impls:
        shape += f" paths={','.join(impls)}"
    return f"{machine_key(device)} | {shape}"


def path_problem(key: str, value) -> str | None:
    """What is wrong with a cached entry of ``attention-paths.json`` (None: nothing): its value must
    name a path of some attention layer and, where its key lists the paths compared
    (:func:`path_cache_key`), one of those."""
    if not isinstance(value, str):
        return f"an attention path's name was expected, got {value!r}"
    compared = _COMPARED.search(key)
    allowed = _KNOWN_PATHS if compared is None else set(compared.group(1).split(",")) & _KNOWN_PATHS
    if value not in allowed:
        return (f"it names the attention path {value!r}, which is not one of "
                f"{', '.join(sorted(allowed)) or 'the paths attncnn has'}")
    return None


class PathChoice(NamedTuple):
    """What :func:`choose_impl` chose and how."""

    impl: str
    #: seconds per path: the median of :data:`REPS` timed calls ("measured"), or the first call each
    #: path gets ("one call each"); None for "cached" and "the only path"
    timings: dict[str, float] | None
    how: str


def timing_pays(first_call: dict[str, float], uses: int, reps: int = REPS) -> bool:
    """Whether timing ``reps`` calls of each path can pay back over a run that calls the layer
    ``uses`` times: False when those calls, all on the slowest path (``first_call``: seconds of one
    call of each), would take less than the timing itself, since no choice can then save what the
    timing costs. A bound, not an estimate: it measures whenever a choice could pay."""
    return uses * max(first_call.values()) >= reps * sum(first_call.values())


def choose_impl(model_config, *, batch: int, image_size: tuple[int, int], precision: str, device: torch.device,
                cache_dir: str | os.PathLike[str] | None = None,
                mode: str = "train", uses: int | None = None) -> PathChoice:
    """The fastest path of ``model_config``'s attention layers for this run, from the cache or measured.

    Args:
        model_config: an :class:`~attncnn.models.ImageTransformerConfig` (``impl`` is ignored).
        batch: images per step (``mode="eval"``: per test batch) and process. image_size: ``(H, W)`` of the images.
        precision: ``"fp32"`` or ``"bf16"`` (resolved). device: where the run trains.
        cache_dir: folder of the cache file (default: the data cache folder, :func:`attncnn.data.default_data_dir`).
        mode: ``"train"`` times forward + backward in training mode; ``"eval"`` the forward alone in
            eval mode without gradients (a test pass), cached under its own key.
        uses: how often the run calls such a layer in this mode (steps x layers; None: unknown, so
            many that timing pays). Where timing cannot pay back (:func:`timing_pays`), the path
            fastest in the first call each path gets is chosen and not cached.

    Raises:
        ValueError: a ``mode`` other than those two.

    Returns:
        a :class:`PathChoice`: the path, the seconds per path, and how it was chosen ("cached",
        "the only path": a kind with one path besides ``"auto"``, "measured", "one call each").
    """
    if mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
    p = model_config.pooling
    grid = (image_size[0] // p, image_size[1] // p)
    torch.manual_seed(0)            # the weights of the probe layer; the run seeds itself afterwards
    layer = build_attention(model_config.attention, model_config.dim, model_config.num_heads,
                            **model_config.attention_kwargs()).train(mode == "train")
    # paths that cannot run here (a kernel of another device) are not candidates, nor in the cache key
    impls = tuple(i for i in layer.impls if i != "auto"
                  and layer.path_unavailable(i, torch.device(device), backward=mode == "train") is None)
    if len(impls) == 1:
        return PathChoice(impls[0], None, "the only path")
    path = Path(cache_dir) if cache_dir is not None else default_data_dir()
    path = path / CACHE_NAME
    key = path_cache_key(model_config, batch, grid, precision, device, impls)
    if mode == "eval":
        key += " | test pass"           # training's keys stay as they were: their cached choices still hold
    cached = read_cache(path, path_problem).get(key)
    if cached in impls:
        return PathChoice(cached, None, "cached")
    busy = busy_reason(device)              # sampled before the timing's own threads load the CPU
    layer = layer.to(device)
    x = torch.randn(batch, *grid, model_config.dim, device=device)
    dtype = torch.bfloat16 if precision == "bf16" else None
    first_call = _working_paths(layer, x, impls, dtype, backward=mode == "train")
    if uses is not None and not timing_pays(first_call, uses):
        return PathChoice(min(first_call, key=first_call.get), first_call, "one call each")
    timings = time_impls(layer, x, autocast_dtype=dtype, reps=REPS, impls=tuple(first_call),
                         backward=mode == "train", warmup=0)      # _working_paths ran each once: first touch done
    best = min(timings, key=timings.get)
    if busy is None:
        write_cache(path, key, best, path_problem)
    else:
        log.info("attention path (%s) measured while %s: the choice serves this run and is not cached (the next "
                 "run measures again)", "test pass" if mode == "eval" else "training", busy)
    return PathChoice(best, timings, "measured")


def _working_paths(layer, x: torch.Tensor, impls: tuple[str, ...], dtype: torch.dtype | None, *,
                   backward: bool) -> dict[str, float]:
    """The paths of ``impls`` that run here, with the seconds of that first call: each is tried once
    (a fused kernel a device or a torch build lacks can raise where the others run; this call also
    does the first touch of buffers that timing must not see); one that raises is left out of the
    choice with a warning naming it and the error.

    Raises:
        the first path's error when no path runs.
    """
    working, errors = {}, []
    x = x.detach().requires_grad_(backward)
    with paths_restored(layer):
        for impl in impls:
            try:
                took = seconds(lambda: run_impl(layer, x, impl, autocast_dtype=dtype, backward=backward), x.device)
            except Exception as err:    # noqa: BLE001 - any failure of a path means: do not choose it
                errors.append(err)
                log.warning("attention path %s failed on %s (%s: %s); it is left out of the choice", impl,
                            x.device, type(err).__name__, str(err).splitlines()[0] if str(err) else "")
            else:
                working[impl] = took
    if not working:
        raise errors[0]
    return working


def with_measured_paths(config, dataset, batch: int, dist, steps: int | None = None) -> object:
    """``config`` with ``model.impl`` set to the fastest training path here and ``model.eval_impl``
    to the fastest test-pass path where that is another one (:func:`choose_impl`), or unchanged:
    when ``measure_paths`` is off, the run is ``deterministic``, several processes train (each would
    time its own share of the machine), the model options name an ``impl`` (then ``eval_impl``
    stays as given: unset means the same path), or the network has no attention layers.

    Args:
        config: the run as its plan is being made (:class:`~attncnn.perf.plan.PlannedRun`: the
            recipe with the run-time choices so far, precision resolved).
        dataset: the loaded data set (its image size and test split). batch: images per step and process.
        dist: the run's :class:`~attncnn.training.distributed.Distributed`.
        steps: the run's training steps (None: unknown). With it, a run too short for timing to pay
            back chooses from one call of each path (:func:`choose_impl`'s ``uses``: steps x layers
            in training; test batches x test passes x layers for the test pass).
    """
    if not config.measure_paths or config.deterministic or dist.enabled or "impl" in config.model:
        return config
    arch, model_config = preset_model_config(config.preset, dataset.num_classes, **config.model)
    if not hasattr(model_config, "attention"):
        return config
    common = dict(image_size=tuple(dataset.train.images.shape[-2:]), precision=config.precision,
                  device=dist.device, cache_dir=config.data_dir)
    layers = getattr(model_config, "num_layers", None)
    uses = None if steps is None or layers is None else steps * layers
    choice = choose_impl(model_config, batch=batch, uses=uses, **common)
    _log_choice("training", choice, "forward + backward", uses)
    model = {**config.model, "impl": choice.impl}
    if "eval_impl" not in config.model:
        # the batch a test pass runs: the evaluation batch, or the whole test set when smaller
        test = getattr(dataset, "test", None)
        eval_batch = max(config.eval_batch_size if test is None else min(config.eval_batch_size, len(test.labels)), 1)
        batches = None if test is None else math.ceil(len(test.labels) / eval_batch)
        eval_uses = (None if batches is None or uses is None
                     else count_test_passes(config.epochs, config.eval_every) * batches * layers)
        eval_choice = choose_impl(model_config, batch=eval_batch, mode="eval", uses=eval_uses, **common)
        _log_choice("test pass", eval_choice, "forward", eval_uses)
        if eval_choice.impl != choice.impl:
            model["eval_impl"] = eval_choice.impl
    return dataclasses.replace(config, model=model)


def _log_choice(what: str, choice: PathChoice, timed: str, uses: int | None) -> None:
    if choice.timings is None:
        log.info("attention path (%s) %s (%s)", what, choice.impl,
                 "cached for this machine and shape" if choice.how == "cached" else choice.how)
        return
    times = ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in choice.timings.items())
    if choice.how == "measured":
        log.info("attention path (%s) %s, measured on one layer (%s): %s", what, choice.impl, timed, times)
    else:
        log.info("attention path (%s) %s, the fastest in one call each (%s: %s): the run's %d calls of "
                 "the layer take less than timing %d more of each would; not cached", what, choice.impl, timed,
                 times, uses, REPS)
