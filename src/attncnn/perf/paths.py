"""Which computation path (``impl``) a run's attention layers take: measured on this machine, on
one of the run's own layers, cached.

Every path of a layer computes the same output up to rounding (tests check each pair), but which
is fastest depends on the machine (CPUs of one family disagree; ``benchmarks/paths.py`` compares
them, docs/speed.md has the figures). So a run whose options leave ``impl`` open times every path
of one of its network's attention layers (the first; :func:`run_paths`), on random inputs of its
own batch, grid, precision and device (:func:`attncnn.perf.timing.time_impls`, a few seconds), and
trains with the fastest. A test pass has no backward, so the forward alone is timed too, in eval
mode without gradients on the evaluation batch, and the run evaluates with its own fastest path
where that differs (content attention: the fused kernel stores nothing for a gradient and wins
there, while the written-out scores win in training). This runs inside the training call, on the
real layer, whose state the caller puts back (:class:`attncnn.perf.choosing.RunChooser`). The
choices go into the run's plan (never its recipe: the run's ``machine.json`` records the paths
each layer took), and are cached as typed ``"attention-path"`` records (:mod:`attncnn.perf.cache`)
keyed by the machine (:func:`~attncnn.perf.machine.machine_record`) and the run
(:func:`path_run`: the layer's kind, shape and dropout, the grid, batch, precision, mode and the
paths compared), so the next run on this machine, and a resumed one, reuses them without
measuring: for a given cache the choice is deterministic. A cached record naming a path it did not
compare (:func:`path_problem`: an edited or damaged file) is dropped with a warning naming the file
and measured again. A choice measured while other work shares the CPU
(:func:`~attncnn.perf.machine.busy_reason`) serves its run but is not cached.

A run too short for the timing to pay back does not time: each path runs once anyway (to find the
paths that run at all), and when even the run's every call of the layer on the slowest of them would
take less than timing :data:`REPS` more calls of each (:func:`timing_pays`), the path fastest in that
one call is taken, and not cached (a smoke run of two steps spent most of its time timing paths).

Runs with ``--deterministic`` and runs under torchrun never measure (their numbers must not depend
on timing; several processes would each time their own share of the machine); they keep
``"auto"``, the layers' own rule.

Whether to compile is decided afterwards, on the whole training step of the run's network with
the chosen path (:mod:`attncnn.perf.compiling`): a compiler fuses across layers, so one
layer timed alone would not say what it gains.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch
from torch import nn

from ..layers import ATTENTION_LAYERS, attention_modules, build_attention
from ..layers.base import GridAttention
from .cache import find_record, write_record
from .machine import busy_reason, machine_record
from .timing import paths_restored, run_impl, seconds, time_impls

__all__ = ["CHOICE", "REPS", "PathChoice", "path_run", "path_problem", "timing_pays", "choose_path", "run_paths",
           "choose_impl"]

log = logging.getLogger(__name__)

#: the ``choice`` of this module's cache records
CHOICE = "attention-path"
#: timed calls of each path, alternated across paths: paths within a few per cent of each other (dense
#: and folded on some CPUs) were ordered by noise with 3
REPS = 7
#: every computation path some attention layer has ("auto" is a rule, never a measured choice)
_KNOWN_PATHS = frozenset(i for kind, cls in ATTENTION_LAYERS.items() for i in cls.impls_of(kind)) - {"auto"}


def path_run(layer: GridAttention, *, batch: int, grid: tuple[int, int], precision: str, mode: str,
             paths: tuple[str, ...]) -> dict:
    """The typed ``run`` field of a path record: ``{"kind", "dim", "heads", "head_dim",
    "attn_dropout", "grid", "batch", "precision", "mode", "paths"}`` (``paths``: those compared,
    so that a choice made before a path existed is measured again, not reused)."""
    return {"kind": layer.kind, "dim": layer.dim, "heads": layer.num_heads, "head_dim": layer.head_dim,
            "attn_dropout": float(layer.attn_drop.p), "grid": list(grid), "batch": batch, "precision": precision,
            "mode": mode, "paths": list(paths)}


def path_problem(run: dict, value) -> str | None:
    """What is wrong with a cached path record (None: nothing): its value must name one of the
    paths its ``run`` says were compared, each a path of some attention layer."""
    if not isinstance(value, str):
        return f"an attention path's name was expected, got {value!r}"
    compared = run.get("paths")
    allowed = set(compared) & _KNOWN_PATHS if isinstance(compared, list) and all(
        isinstance(p, str) for p in compared) else set()
    if value not in allowed:
        return (f"it names the attention path {value!r}, which is not one of "
                f"{', '.join(sorted(allowed)) or 'the paths it compared'}")
    return None


class PathChoice(NamedTuple):
    """What :func:`choose_path` chose and how."""

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


def choose_path(layer: GridAttention, *, batch: int, grid: tuple[int, int], precision: str, device: torch.device,
                mode: str = "train", uses: int | None = None) -> PathChoice:
    """The fastest path of ``layer`` for this run, from the cache or timed on ``layer`` itself.

    Args:
        layer: an attention layer on ``device`` (a run's own: its paths come back afterwards, its
            mode too; its gradients are dropped, and random numbers drawn: the caller keeps what it
            needs, as :class:`~attncnn.perf.choosing.RunChooser` does).
        batch: inputs per call (``mode="eval"``: per test batch). grid: ``(H, W)`` of the layer's token grid.
        precision: ``"fp32"`` or ``"bf16"`` (resolved). device: where the run trains.
        mode: ``"train"`` times forward + backward in training mode; ``"eval"`` the forward alone in
            eval mode without gradients (a test pass), cached as its own record.
        uses: how often the run calls such a layer in this mode (steps x layers; None: unknown, so
            many that timing pays). Where timing cannot pay back (:func:`timing_pays`), the path
            fastest in the first call each path gets is chosen and not cached.

    Raises:
        ValueError: a ``mode`` other than those two. The first path's error when no path runs.

    Returns:
        a :class:`PathChoice`: the path, the seconds per path, and how it was chosen ("cached",
        "the only path": a kind with one path besides ``"auto"``, "measured", "one call each").
    """
    if mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
    device = torch.device(device)
    # paths that cannot run here (a kernel of another device) are not candidates, nor in the record
    impls = tuple(i for i in layer.impls if i != "auto"
                  and layer.path_unavailable(i, device, backward=mode == "train") is None)
    if len(impls) == 1:
        return PathChoice(impls[0], None, "the only path")
    machine = machine_record(device)
    run = path_run(layer, batch=batch, grid=grid, precision=precision, mode=mode, paths=impls)
    cached = find_record(CHOICE, machine, run, path_problem)
    if cached in impls:
        return PathChoice(cached, None, "cached")
    busy = busy_reason(device)              # sampled before the timing's own threads load the CPU
    was = layer.training
    layer.train(mode == "train")
    try:
        x = torch.randn(batch, *grid, layer.dim, device=device)
        dtype = torch.bfloat16 if precision == "bf16" else None
        first_call = _working_paths(layer, x, impls, dtype, backward=mode == "train")
        if uses is not None and not timing_pays(first_call, uses):
            return PathChoice(min(first_call, key=first_call.get), first_call, "one call each")
        timings = time_impls(layer, x, autocast_dtype=dtype, reps=REPS, impls=tuple(first_call),
                             backward=mode == "train", warmup=0)      # _working_paths ran each once: first touch done
    finally:
        layer.train(was)
    best = min(timings, key=timings.get)
    if busy is None:
        write_record(CHOICE, machine, run, best, path_problem)
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


def run_paths(model: nn.Module, *, image_size: tuple[int, int], batch: int, eval_batch: int | None, precision: str,
              device: torch.device, steps: int | None = None, test_calls: int | None = None) -> tuple[str, str | None]:
    """The training path and, where ``eval_batch`` is given, the test-pass path of a run of
    ``model`` (:func:`choose_path` on its first attention layer); ``(None, None)`` for a network
    without attention layers. The test-pass path is None where it is the training path.

    Args:
        model: the run's network (its first attention layer is timed; the caller restores its state).
        image_size: ``(H, W)`` of the images; the layer's grid is that over the model's pooling width.
        batch: training images per step. eval_batch: images per test batch (None: the test-pass
            path is not chosen).
        steps: the run's training steps; test_calls: its test batches over all its test passes
            (None: unknown). Times the layer count, they are :func:`choose_path`'s ``uses``.
    """
    layers = attention_modules(model)
    if not layers:
        return None, None
    pooling = getattr(getattr(model, "config", None), "pooling", 1)
    grid = (image_size[0] // pooling, image_size[1] // pooling)
    common = dict(grid=grid, precision=precision, device=device)
    uses = None if steps is None else steps * len(layers)
    choice = choose_path(layers[0], batch=batch, uses=uses, **common)
    _log_choice("training", choice, "forward + backward", uses)
    if eval_batch is None:
        return choice.impl, None
    eval_uses = None if test_calls is None else test_calls * len(layers)
    eval_choice = choose_path(layers[0], batch=eval_batch, mode="eval", uses=eval_uses, **common)
    _log_choice("test pass", eval_choice, "forward", eval_uses)
    return choice.impl, (eval_choice.impl if eval_choice.impl != choice.impl else None)


def choose_impl(model_config, *, batch: int, image_size: tuple[int, int], precision: str, device: torch.device,
                mode: str = "train", uses: int | None = None) -> PathChoice:
    """:func:`choose_path` on a layer built from ``model_config`` (an
    :class:`~attncnn.models.ImageTransformerConfig`; ``impl`` ignored) with seeded weights, for
    callers that have no run's network: ``attncnn bench`` (the paths a run would take here) and the
    benchmark scripts. The caller's random state is left as it was.

    Raises:
        ValueError: a ``mode`` other than ``"train"`` and ``"eval"``.
    """
    p = model_config.pooling
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layer = build_attention(model_config.attention, model_config.dim, model_config.num_heads,
                                **model_config.attention_kwargs()).to(device)
        return choose_path(layer, batch=batch, grid=(image_size[0] // p, image_size[1] // p), precision=precision,
                           device=device, mode=mode, uses=uses)


def _log_choice(what: str, choice: PathChoice, timed: str, uses: int | None) -> None:
    if choice.timings is None:
        log.info("attention path (%s) %s (%s)", what, choice.impl,
                 "cached for this machine and shape" if choice.how == "cached" else choice.how)
        return
    times = ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in choice.timings.items())
    if choice.how == "measured":
        log.info("attention path (%s) %s, measured on one layer of the run's network (%s): %s", what, choice.impl,
                 timed, times)
    else:
        log.info("attention path (%s) %s, the fastest in one call each (%s: %s): the run's %d calls of "
                 "the layer take less than timing %d more of each would; not cached", what, choice.impl, timed,
                 times, uses, REPS)
