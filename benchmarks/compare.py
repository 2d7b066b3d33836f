"""Side-by-side benchmark: our layers vs the reference-style baseline, same weights, one run.

    python benchmarks/compare.py [--presets quadratic,learned,learned-content] [--layers 2]
                                 [--batch-size 100] [--device cpu] [--reps 3] [--out benchmarks/results]

For each preset it first checks that both implementations give the same outputs (float64, small
batch), then measures each one in a fresh process (training and inference images/s, peak memory,
FLOP/s; conventions in attncnn/bench/harness.py), prints the ratios and writes a Markdown table to
``<out>/<machine>-<date>.md``. Attention layers are identical, so timing ``--layers`` of them gives
the same ratios as all six in a fraction of the time (the table says how many were timed).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from reference_style import reference_style_model  # noqa: E402

from attncnn._io import atomic_write_text  # noqa: E402
from attncnn.bench.harness import bench_preset_isolated, machine_info, matmul_peak  # noqa: E402
from attncnn.models import build_model  # noqa: E402


def check_same_outputs(preset: str, overrides: dict) -> float:
    """Max |ours - reference| on a float64 batch (raises if above 1e-9)."""
    torch.manual_seed(0)
    model = build_model(preset, **overrides).double().eval()
    ref = reference_style_model(model).eval()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        err = (model(x) - ref(x)).abs().max().item()
    if err > 1e-9:
        raise SystemExit(f"{preset}: reference-style baseline differs from ours by {err:.3g}")
    return err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="quadratic,learned,learned-content")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()

    device = torch.device(args.device)
    info = machine_info(device)
    peak = matmul_peak(device)
    overrides = {"num_layers": args.layers}
    rows = []
    for preset in [p.strip() for p in args.presets.split(",") if p.strip()]:
        err = check_same_outputs(preset, overrides)
        common = dict(preset=preset, batch_size=args.batch_size, device=args.device, overrides=overrides,
                      reps=args.reps, extra_sys_path=[str(HERE)])
        ours = bench_preset_isolated(impl="ours", **common)
        ref = bench_preset_isolated(impl="reference", **common)
        rows.append((preset, err, ours, ref))
        print(f"{preset}: train {ours['train_images_per_s']:.1f} vs {ref['train_images_per_s']:.1f} img/s "
              f"(x{ours['train_images_per_s'] / ref['train_images_per_s']:.2f}), infer "
              f"{ours['infer_images_per_s']:.1f} vs {ref['infer_images_per_s']:.1f} img/s, peak memory "
              f"{ours['peak_memory_bytes'] / 2**20:.0f} vs {ref['peak_memory_bytes'] / 2**20:.0f} MiB "
              f"(x{ours['peak_memory_bytes'] / max(ref['peak_memory_bytes'], 1):.2f}), model FLOP/s "
              f"{ours['model_flops_per_s'] / peak:.2f} of matmul peak; max |diff| {err:.1e}", flush=True)

    lines = [f"# Ours vs reference-style baseline, {info['date']}", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items() if k != "date") + ".",
             f"Matrix-product peak (fp32, 2048^2): {peak / 1e9:.1f} GFLOP/s. Batch {args.batch_size}, fp32, "
             f"{args.layers} attention layers timed (all layers are identical; ratios hold for 6). "
             "Median of the timed steps after one warm-up; each measurement in a fresh process.", "",
             "| preset | train img/s ours | reference | ratio | infer img/s ours | reference | ratio "
             "| peak MiB ours | reference | ratio | model FLOP/s / peak (ours) | max abs diff |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for preset, err, o, r in rows:
        lines.append(
            f"| {preset} | {o['train_images_per_s']:.1f} | {r['train_images_per_s']:.1f} "
            f"| {o['train_images_per_s'] / r['train_images_per_s']:.2f} | {o['infer_images_per_s']:.1f} "
            f"| {r['infer_images_per_s']:.1f} | {o['infer_images_per_s'] / r['infer_images_per_s']:.2f} "
            f"| {o['peak_memory_bytes'] / 2**20:.0f} | {r['peak_memory_bytes'] / 2**20:.0f} "
            f"| {o['peak_memory_bytes'] / max(r['peak_memory_bytes'], 1):.2f} "
            f"| {o['model_flops_per_s'] / peak:.2f} | {err:.1e} |")
    name = re.sub(r"[^A-Za-z0-9]+", "-", info.get("gpu", info["cpu"])).strip("-").lower()
    out = Path(args.out) / f"{name}-{info['cores']}cores-{info['date']}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
