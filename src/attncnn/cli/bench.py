"""``attncnn bench``: training/inference throughput, memory and FLOP/s of the presets on this machine
(:func:`attncnn.perf.bench.presets.bench_presets`)."""

from __future__ import annotations

import argparse
import json
import sys

from ..perf.bench.presets import DEFAULT_PRESETS, VARIANTS
from ._parsing import key_value

__all__ = ["register", "handle"]


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure images/s, peak memory and FLOP/s of presets")
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
    p.set_defaults(handler=handle)


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


def handle(args: argparse.Namespace) -> int:
    from ..perf.bench.presets import bench_presets

    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    measured = bench_presets(presets, variants=args.variants, batch_size=args.batch_size, device=args.device,
                             layers=args.layers, overrides=dict(args.overrides), reps=args.reps)
    if measured["skipped"]:
        print(measured["skipped"], file=sys.stderr)
    info, peaks, results = measured["machine"], measured["matmul_peak_flops_per_s"], measured["results"]
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
