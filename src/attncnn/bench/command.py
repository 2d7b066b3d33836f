"""``attncnn bench``: training/inference throughput, memory and FLOP/s of the presets on this machine."""

from __future__ import annotations

import argparse
import json

__all__ = ["register"]

DEFAULT_PRESETS = ("demo", "quadratic", "learned", "learned-content", "resnet18")


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure images/s, peak memory and FLOP/s of presets")
    p.add_argument("--presets", default=",".join(DEFAULT_PRESETS), help="comma-separated preset names")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--device", default="auto")
    p.add_argument("--layers", type=int, help="time the attention presets with this many (identical) layers")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast (CUDA)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def _row(r: dict, peak: float) -> str:
    return (f"{r['preset']:<18} {r['train_images_per_s']:>9.1f} {r['infer_images_per_s']:>9.1f} "
            f"{r['peak_memory_bytes'] / 2**20:>9.0f} {r['forward_flops_per_image'] / 2e9:>8.3f} "
            f"{r['model_flops_per_s'] / 1e9:>9.1f} {r['model_flops_per_s'] / peak:>6.2f}")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..models import get_preset
    from ..training import resolve_device
    from .harness import bench_preset_isolated, machine_info, matmul_peak

    device = resolve_device(args.device)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    for name in presets:
        get_preset(name)   # unknown names fail before any timing
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    peak = matmul_peak(device, dtype)
    results = []
    for name in presets:
        overrides = {}
        if args.layers and get_preset(name).arch == "image-transformer":
            overrides["num_layers"] = args.layers
        results.append(bench_preset_isolated(preset=name, batch_size=args.batch_size, device=str(device),
                                             overrides=overrides, reps=args.reps, bf16=args.bf16,
                                             compile=args.compile))
    info = machine_info(device)
    if args.json:
        print(json.dumps({"machine": info, "matmul_peak_flops_per_s": peak, "results": results}, indent=2))
        return 0
    print(", ".join(f"{k}: {v}" for k, v in info.items()))
    print(f"matrix-product peak ({dtype}): {peak / 1e9:.1f} GFLOP/s")
    print(f"{'preset':<18} {'train/s':>9} {'infer/s':>9} {'peak MiB':>9} {'fwd GMAC':>8} "
          f"{'GFLOP/s':>9} {'/peak':>6}")
    for r in results:
        print(_row(r, peak))
    return 0
