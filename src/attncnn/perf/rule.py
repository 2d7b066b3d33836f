"""The one written rule for a run's attention paths and compile: :func:`choose`.

A pure function of the device kind, the attention kind, the token grid, the precision and the
run's length: nothing is measured, nothing is read from or written to a file. Each table entry
names its measurement in ``benchmarks/results/`` (its ``source``); ``docs/speed.md`` shows the
table. ``attncnn train --impl``, ``--eval-impl`` and ``--compile`` / ``--no-compile`` override it;
``--impl measure`` and ``--measure-compile`` time the candidates instead (:mod:`attncnn.perf.measure`).

The device kind (:func:`device_kind`) is the device type, with CPUs split by whether they have AMX
tiles (the fastest position-only path differs between the two). ``"auto"`` in a table stands for
the layers' own shape rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Choice", "choose", "device_kind", "family", "PATHS", "COMPILE", "MIN_COMPILED_SECONDS"]

#: a run compiles only where it would train at least this long eager (ten minutes), which a
#: compilation's cost (seconds to a minute, paid by every process) cannot outweigh
MIN_COMPILED_SECONDS = 600.0

#: the attention families of the tables: each kind's family (kinds not named: ``"other"``)
_FAMILIES = {"quadratic": "position-only", "learned": "position-only",
             "quadratic-generalized": "position-only-dense", "learned-content": "learned-content",
             "content": "content", "gpsa": "gpsa"}

#: ``(device kind, family) -> (training path, test-pass path, source)``; the source names the
#: measurement (file in ``benchmarks/results/`` and its row). A path given as a pair
#: ``(small, large)`` is chosen by the grid: ``large`` where ``H W >= 6 (H + W)`` (:func:`_large`)
PATHS: dict[tuple[str, str], tuple] = {
    ("cpu-amx", "position-only"): (
        "folded", ("dense", "folded"),
        "attention-paths.md, 'the folded path': quadratic-mini and learned-mini rows (training step dense 389 / "
        "folded 330 / separable 431 ms; forward 129 / 98 / 131 ms); at 8 x 8 tokens the demo's measured choice "
        "folded / dense (docs/quickstart.md's log, 2026-11-27)"),
    ("cpu-amx", "position-only-dense"): (
        "folded", "folded", "attention-paths.md, 'the folded path': quadratic-generalized-mini row (a tie: "
                            "333-381 / 342-348 ms)"),
    ("cpu", "position-only"): (
        ("dense", "separable"), ("dense", "separable"),
        "paths-amd-epyc-2cores-2026-12-02.md: quadratic-mini and learned-mini rows (16 x 16 tokens: training step "
        "separable 4,108 / folded 4,952 / dense 5,680 ms); at 8 x 8 dense, what the trainer's own timing took "
        "for the demo in each of 8 runs (speed-rule-amd-epyc-2cores-2026-12-02.md); attention-paths.md, "
        "'separable vs dense' (the grid threshold, fp32 too)"),
    ("cpu", "position-only-dense"): (
        "dense", "dense", "paths-amd-epyc-2cores-2026-12-02.md: quadratic-generalized-mini row (training step "
                          "dense 17,625 / folded 22,328 ms)"),
    ("cpu-amx", "learned-content"): (
        "auto", "auto", "attention-paths.md, 'the q.r term inside the q.k product' and 'the bilinear form': "
                        "explicit-onehot at width 64, bilinear at width 400"),
    ("cpu", "learned-content"): (
        "auto", "auto", "attention-paths.md, 'the same rule on a CPU without AMX': explicit-onehot at width 64, "
                        "bilinear at width 400"),
    ("cpu-amx", "content"): (
        "explicit-half", "auto", "speedup-intel-r--xeon-r--processor-2cores-2026-11-26-3.md, deit-mini row: "
                                 "explicit-half / sdpa"),
    ("cpu-amx", "gpsa"): (
        "explicit-half", "auto", "attention-paths.md, 'GPSA with narrow heads': convit-mini rows "
                                 "(training 1,042 vs 1,720 ms; test pass sdpa 180 vs 469 ms)"),
    ("cpu", "gpsa"): (
        "explicit-half", "auto", "paths-amd-epyc-2cores-2026-12-02.md: gpsa-mini row (training step 10,836 vs "
                                 "sdpa 16,696 ms; forward sdpa 4,234 vs 4,465 ms)"),
    ("cuda", "position-only"): (
        "dense", "dense", "HISTORY.md 2026-11-25, H100: quadratic-mini dense 3.2 ms, separable 4.0 ms"),
    ("cuda", "position-only-dense"): (
        "dense", "dense", "HISTORY.md 2026-11-26, H200: quadratic-generalized-mini dense 2.2 ms, folded 3.2 ms"),
    ("cuda", "learned-content"): (
        "explicit-half", "sdpa", "gpu-speed-nvidia-h200-2026-11-27.md: the paper width's measured paths "
                                 "explicit-half / sdpa (at width 64 sdpa 3.9 ms, explicit-half 4.7 ms)"),
}

#: ``(device kind, family) -> (eager training images/s, source)``: where compiling was faster on
#: every machine of that kind that recorded it (family ``None``: the ResNet). A run compiles when it
#: would train at least :data:`MIN_COMPILED_SECONDS` at that speed (the fastest recorded at batch 100,
#: so that the estimate never makes a run look longer than it is).
COMPILE: dict[tuple[str, str | None], tuple[float, str]] = {
    ("cpu", None): (912.5, "speedup-amd-epyc-2cores-2026-11-25.md, resnet18-mini row: 1.86x compiled, 912.5 "
                           "images/s eager"),
    ("cpu-amx", None): (1389.0, "compile-choice-intel-r--xeon-r--processor-2cores-2026-11-26.md, resnet18-mini "
                                "row: 1.24x; 1,389 images/s eager: speedup-intel-r--xeon-r--processor-2cores-"
                                "2026-11-26-4.md"),
    ("cpu-amx", "learned-content"): (68.8, "compile-choice-intel-r--xeon-r--processor-2cores-2026-11-27.md: "
                                           "1.15x; 68.8 images/s eager: speedup-intel-r--xeon-r--processor-"
                                           "2cores-2026-11-27.md"),
    ("cpu-amx", "gpsa"): (86.0, "compile-choice-intel-r--xeon-r--processor-2cores-2026-11-26.md, gpsa-mini row: "
                                "1.22x; 86.0 images/s eager: speedup-intel-r--xeon-r--processor-2cores-"
                                "2026-11-26-4.md"),
    ("cuda", "learned-content"): (2010.0, "gpu-speed-nvidia-h200-2026-11-27.md: 3,104 compiled against 2,010 "
                                          "eager images/s (1.54x)"),
}


@dataclass(frozen=True)
class Choice:
    """What the rule takes for a run.

    Attributes:
        train_impl: the attention path of training (``"auto"``: the layers' own shape rule; None:
            the network has no attention layers). eval_impl: that of test passes.
        compile: compile the training step.
        source: the measurements behind the paths and the compile decision, for the log.
    """

    train_impl: str | None
    eval_impl: str | None
    compile: bool
    source: str


def device_kind(device: torch.device | str) -> str:
    """The device kind of the tables: ``"cuda"``, ``"cpu-amx"`` (a CPU with AMX tiles), ``"cpu"``
    (any other CPU), else the device type. Read from the device, never timed."""
    device = torch.device(device)
    if device.type == "cpu" and torch.cpu._is_amx_tile_supported():
        return "cpu-amx"
    return device.type


def _large(grid: tuple[int, int]) -> bool:
    """The grid is large enough for the separable path to gain, ``H W >= 6 (H + W)`` (12 x 12 and
    larger squares; the dense/separable multiply-add ratio, attention-paths.md)."""
    return grid[0] * grid[1] >= 6 * (grid[0] + grid[1])


def family(kind: str | None) -> str | None:
    """The table family of an attention ``kind`` (None: a network without attention layers)."""
    return None if kind is None else _FAMILIES.get(kind, "other")


def choose(device: str, kind: str | None, grid: tuple[int, int], precision: str, steps: int, *,
           batch: int = 100) -> Choice:
    """The attention paths and compile setting of a run (module docstring).

    Args:
        device: the device kind (:func:`device_kind`; one without table rows gets the layers' own
            rule and no compile).
        kind: the attention kind of the network's layers (``"quadratic"``, ...), None without any.
        grid: ``(H, W)`` token grid of the attention layers.
        precision: ``"fp32"`` or ``"bf16"``.
        steps: training steps the run (or the resumed segment) takes; batch: images per step (the
            run's eager length is estimated from :data:`COMPILE`'s speeds).

    Returns:
        a :class:`Choice`.

    Raises:
        ValueError: a precision other than ``"fp32"`` or ``"bf16"``, or a negative ``steps``.
    """
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32' or 'bf16' (resolved), got {precision!r}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    group = family(kind)
    sources = []
    if group is None:
        train = evaluate = None
    elif (device, group) in PATHS:
        train, evaluate, where = PATHS[device, group]
        train, evaluate = (p[_large(grid)] if isinstance(p, tuple) else p for p in (train, evaluate))
        sources.append(f"paths: {where}")
    else:
        train = evaluate = "auto"
        sources.append("paths: the layers' own rule (no measurement for this device and kind)")
    compile = False
    if (device, group) in COMPILE:
        speed, where = COMPILE[device, group]
        compile = steps * batch / speed >= MIN_COMPILED_SECONDS
        sources.append(f"compile {'on' if compile else 'off'}: {steps} steps of {batch} images, at least "
                       f"{steps * batch / speed:.0f} s eager (compiled from {MIN_COMPILED_SECONDS:.0f} s; {where})")
    else:
        sources.append("compile off: not measured faster compiled on every such machine")
    return Choice(train, evaluate, compile, "; ".join(sources))
