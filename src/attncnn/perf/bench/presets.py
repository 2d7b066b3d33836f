"""``attncnn bench`` as a function: training/inference throughput, memory and FLOP/s of presets
on this machine, each in its own process (:func:`~attncnn.perf.bench.harness.bench_preset_isolated`),
beside the device's matrix-product peaks."""

from __future__ import annotations

from typing import Sequence

from ...errors import InputError

__all__ = ["DEFAULT_PRESETS", "VARIANTS", "parse_variants", "bench_presets"]

#: the presets ``attncnn bench`` times by default
DEFAULT_PRESETS = ("demo", "quadratic", "learned", "learned-content", "resnet18")
#: precision (+ compile) settings a benchmark can compare side by side
VARIANTS = ("fp32", "bf16", "fp32+compile", "bf16+compile")


def parse_variants(text: str) -> list[tuple[str, bool]]:
    """``"fp32,bf16+compile"`` -> ``[("fp32", False), ("bf16", True)]``.

    Raises:
        InputError: a name not in :data:`VARIANTS`.
    """
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        raise InputError(f"unknown benchmark variant(s) {bad or text!r}; choose from {', '.join(VARIANTS)}")
    return [(v.split("+")[0], v.endswith("+compile")) for v in names]


def bench_presets(presets: Sequence[str] = DEFAULT_PRESETS, *, variants: str | None = None, batch_size: int = 100,
                  device: str = "auto", layers: int | None = None, overrides: dict | None = None,
                  reps: int = 3) -> dict:
    """Time each preset in each variant (``attncnn bench``).

    Args:
        presets: preset names (unknown ones are refused before any timing).
        variants: comma-separated names of :data:`VARIANTS`; default ``fp32,bf16``, or ``fp32`` alone
            where bf16 is slow on the device (:func:`~attncnn.perf.precision.slow_bf16_reason`).
        batch_size: images per step.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N``.
        layers: give the attention presets this many (identical) layers.
        overrides: model options for every preset (e.g. ``{"impl": "folded"}``).
        reps: timed repetitions per measurement.

    Returns:
        ``{"machine": machine_info, "matmul_peak_flops_per_s": {precision: FLOP/s}, "results": [one
        harness record per preset and variant], "skipped": the line saying why bf16 was left out, or
        None}``.

    Raises:
        InputError: an unknown preset or variant, or a bad device.
    """
    import torch

    from ...models import get_preset
    from .. import resolve_device
    from ..machine import machine_info
    from ..precision import slow_bf16_reason
    from .harness import bench_preset_isolated, matmul_peak

    device = resolve_device(device)
    for name in presets:
        get_preset(name)   # unknown names fail before any timing
    slow_bf16 = slow_bf16_reason(device)
    if variants:
        text, skipped = variants, None
    elif slow_bf16 is None:
        text, skipped = "fp32,bf16", None
    else:
        text, skipped = "fp32", f"bench: bf16 skipped: {slow_bf16}; pass --variants fp32,bf16 to time it anyway"
    chosen = parse_variants(text)
    # the bf16 peak only where bf16 is fast or asked for: elsewhere it alone takes minutes
    timed = {"fp32"} | {precision for precision, _ in chosen} | ({"bf16"} if slow_bf16 is None else set())
    peaks = {p: matmul_peak(device, torch.bfloat16 if p == "bf16" else torch.float32)
             for p in ("fp32", "bf16") if p in timed}
    results = []
    for name in presets:
        options = dict(overrides or {})
        if layers and get_preset(name).arch == "image-transformer":
            options["num_layers"] = layers
        for precision, compile in chosen:
            results.append(bench_preset_isolated(preset=name, batch_size=batch_size, device=str(device),
                                                 overrides=options, reps=reps, precision=precision, compile=compile))
    return {"machine": machine_info(device), "matmul_peak_flops_per_s": peaks, "results": results,
            "skipped": skipped}
