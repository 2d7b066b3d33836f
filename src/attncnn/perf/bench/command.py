"""``attncnn bench``: training/inference throughput, memory and FLOP/s of the presets on this machine."""

from __future__ import annotations

import argparse
import json
import sys

from ...errors import InputError
from ...runs.options import key_value

__all__ = ["register", "parse_variants", "default_variants", "VARIANTS"]

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


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure images/s, peak memory and FLOP/s of presets")
    p.add_argument("--presets", default=",".join(DEFAULT_PRESETS), help="comma-separated preset names")
    p.add_argument("--variants",
                   help=f"comma-separated precisions to compare side by side, from {', '.join(VARIANTS)} (default: "
                        "fp32,bf16 where the device has fast bf16, else fp32, with one line saying why)")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--device", default="auto")
    p.add_argument("--layers", type=int, help="time the attention presets with this many (identical) layers")
    p.add_argument("--set", dest="overrides", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="a model option for every preset, e.g. impl=folded (the attention path to time)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def default_variants(slow_bf16: str | None) -> tuple[str, str | None]:
    """The variants ``attncnn bench`` times without ``--variants``, and the line that says why bf16
    is left out (None when it is not): bf16 only where the device runs it fast, since elsewhere its
    matrix-product peak and steps alone take minutes (a 2048^3 product at ~1 GFLOP/s).

    Args:
        slow_bf16: why bf16 is slow on the device
            (:func:`~attncnn.perf.precision.slow_bf16_reason`), None where it is fast.
    """
    if slow_bf16 is None:
        return "fp32,bf16", None
    return "fp32", f"bench: bf16 skipped: {slow_bf16}; pass --variants fp32,bf16 to time it anyway"


def _share(value: float, peak: float | None) -> str:
    return f"{value / peak:>6.2f}" if peak else f"{'-':>6}"


def _row(r: dict, peaks: dict[str, float]) -> str:
    variant = r["precision"] + ("+compile" if r["compile"] else "")
    achieved = r["achieved_flops_per_s"]
    return (f"{r['preset']:<26} {variant:<13} {r['train_images_per_s']:>9.1f} {r['infer_images_per_s']:>9.1f} "
            f"{r['peak_memory_bytes'] / 2**20:>9.0f} {r['forward_flops_per_image'] / 2e9:>8.3f} "
            f"{r['model_flops_per_s'] / 1e9:>9.1f} {_share(r['model_flops_per_s'], peaks.get(r['precision']))} "
            f"{r['train_flops_per_image_as_run'] / 1e9:>8.3f} {achieved / 1e9:>9.1f} "
            f"{_share(achieved, peaks.get('fp32'))} {_share(achieved, peaks.get('bf16'))}")


def run(args: argparse.Namespace) -> int:
    import torch

    from ...models import get_preset
    from .. import resolve_device
    from ..machine import machine_info
    from ..precision import slow_bf16_reason
    from .harness import bench_preset_isolated, matmul_peak

    device = resolve_device(args.device)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    for name in presets:
        get_preset(name)   # unknown names fail before any timing
    slow_bf16 = slow_bf16_reason(device)
    text, skipped = (args.variants, None) if args.variants else default_variants(slow_bf16)
    variants = parse_variants(text)
    if skipped:
        print(skipped, file=sys.stderr)
    # the bf16 peak only where bf16 is fast or asked for: elsewhere it alone takes minutes
    timed = {"fp32"} | {precision for precision, _ in variants} | ({"bf16"} if slow_bf16 is None else set())
    peaks = {p: matmul_peak(device, torch.bfloat16 if p == "bf16" else torch.float32)
             for p in ("fp32", "bf16") if p in timed}
    results = []
    for name in presets:
        overrides = dict(args.overrides)
        if args.layers and get_preset(name).arch == "image-transformer":
            overrides["num_layers"] = args.layers
        for precision, compile in variants:
            results.append(bench_preset_isolated(preset=name, batch_size=args.batch_size, device=str(device),
                                                 overrides=overrides, reps=args.reps, precision=precision,
                                                 compile=compile))
    info = machine_info(device)
    if args.json:
        print(json.dumps({"machine": info, "matmul_peak_flops_per_s": peaks, "results": results}, indent=2))
        return 0
    print(", ".join(f"{k}: {v}" for k, v in info.items()))
    print("matrix-product peak: " + ", ".join(f"{p} {v / 1e9:.1f} GFLOP/s" for p, v in peaks.items()) +
          ("" if "bf16" in peaks else " (bf16 not timed: /bf16 shows -)"))
    print("GFLOP/s and /peak: the dense convention's training FLOPs per second and their share of the "
          "variant's peak; run GF/img, run GF/s: the FLOPs of the formulation actually run (e.g. separable), "
          "per image and per second, and their share of the fp32 and bf16 peaks")
    print(f"{'preset':<26} {'variant':<13} {'train/s':>9} {'infer/s':>9} {'peak MiB':>9} {'fwd GMAC':>8} "
          f"{'GFLOP/s':>9} {'/peak':>6} {'run GF/img':>8} {'run GF/s':>9} {'/fp32':>6} {'/bf16':>6}")
    for r in results:
        print(_row(r, peaks))
    for r in results:
        paths = r.get("attention_paths") or {}
        if paths.get("train"):      # the paths a run would take here (measured once per machine, cached)
            train, test = (", ".join(sorted(set(paths[mode]))) for mode in ("train", "eval"))
            print(f"attention paths of {r['preset']} ({r['precision']}): training {train}, test pass {test}")
    return 0
