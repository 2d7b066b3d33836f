"""Side-by-side benchmark: our layers in fp32, bf16 and bf16 + compile against the reference-style
baseline in fp32 and bf16, same weights, one run.

    python benchmarks/compare.py [--presets quadratic,learned,learned-content] [--layers 2]
        [--batch-size 16] [--variants ours:fp32,ours:bf16,ours:bf16+compile,reference:fp32,reference:bf16]
        [--rounds 2] [--device cpu] [--reps 3] [--out benchmarks/results]

For each preset it first checks that both implementations give the same outputs (float64, small
batch), then measures every variant in a fresh process (training and inference images/s, peak
memory, FLOP/s; conventions in attncnn/perf/bench/harness.py). The variants are measured in turns,
``--rounds`` times (the order reversed every other round), and each figure is the median over the
rounds: on a shared machine a ratio of two measurements taken minutes apart swings by 30 %, taken
in alternation it does not. Ratios are against the reference style in fp32 and under the same
precision. A Markdown table goes to ``<out>/<machine>-<date>.md``. Attention layers are identical,
so timing ``--layers`` of them gives the ratios of all six in a fraction of the time.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

import torch

# a sibling script: `python benchmarks/compare.py` puts benchmarks/ first on sys.path
from reference_style import reference_style_model

from attncnn._io import atomic_write_text
from attncnn.models import build_model
from attncnn.perf.bench.presets import parse_variants
from attncnn.perf.bench.harness import bench_preset_isolated, matmul_peak
from attncnn.perf.machine import machine_info

HERE = Path(__file__).resolve().parent

DEFAULT_VARIANTS = "ours:fp32,ours:bf16,ours:bf16+compile,reference:fp32,reference:bf16"
FIGURES = ("train_images_per_s", "infer_images_per_s", "peak_memory_bytes", "model_flops_per_s")


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


def parse(text: str) -> list[tuple[str, str, bool]]:
    """``"ours:bf16+compile,reference:fp32"`` -> ``[("ours", "bf16", True), ("reference", "fp32", False)]``."""
    out = []
    for item in (v.strip() for v in text.split(",") if v.strip()):
        impl, _, variant = item.partition(":")
        if impl not in ("ours", "reference"):
            raise SystemExit(f"variant {item!r}: write ours:<precision> or reference:<precision>")
        out += [(impl, *parse_variants(variant)[0])]
    return out


def measure(preset: str, variants, common: dict, rounds: int) -> dict:
    """Median of each figure over ``rounds`` alternating passes over ``variants``."""
    runs: dict = {v: [] for v in variants}
    for r in range(rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            impl, precision, compile = v
            baseline = reference_style_model if impl == "reference" else None
            runs[v].append(bench_preset_isolated(baseline=baseline, precision=precision, compile=compile,
                                                 **common))
            print(f"  {preset} round {r + 1} {impl}:{precision}{'+compile' if compile else ''}: train "
                  f"{runs[v][-1]['train_images_per_s']:.1f} img/s", flush=True)
    return {v: {k: statistics.median(x[k] for x in runs[v]) for k in FIGURES} for v in variants}


def table(rows: dict, peaks: dict, args, info: dict) -> list[str]:
    lines = [f"# Ours vs reference-style baseline, {info['date']}", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items() if k != "date") + ".",
             "Matrix-product peak (2048^2): " + ", ".join(f"{p} {v / 1e9:.1f} GFLOP/s" for p, v in peaks.items())
             + f". Batch {args.batch_size}, {args.layers} attention layers timed (all layers are identical; ratios "
             f"hold for 6). Median over {args.rounds} alternating rounds of the median of {args.reps} timed steps "
             "after one warm-up; each measurement in a fresh process. Ratios: ours / reference style in fp32, "
             "and / reference style at the same precision.", "",
             "| preset | variant | train img/s | x ref fp32 | x ref same | infer img/s | x ref fp32 | x ref same "
             "| peak MiB | x ref fp32 | model FLOP/s / peak | max abs diff (fp64) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for preset, (err, figures) in rows.items():
        ref32 = figures.get(("reference", "fp32", False))
        for (impl, precision, compile), f in figures.items():
            same = figures.get(("reference", precision, False))

            def ratio(key, base):
                return f"{f[key] / base[key]:.2f}" if base else "-"
            lines.append(
                f"| {preset} | {impl} {precision}{' + compile' if compile else ''} | {f['train_images_per_s']:.1f} "
                f"| {ratio('train_images_per_s', ref32)} | {ratio('train_images_per_s', same)} "
                f"| {f['infer_images_per_s']:.1f} | {ratio('infer_images_per_s', ref32)} "
                f"| {ratio('infer_images_per_s', same)} | {f['peak_memory_bytes'] / 2**20:.0f} "
                f"| {ratio('peak_memory_bytes', ref32)} | {f['model_flops_per_s'] / peaks[precision]:.2f} "
                f"| {err:.1e} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="quadratic,learned,learned-content")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()

    device = torch.device(args.device)
    variants = parse(args.variants)
    info = machine_info(device)
    peaks = {p: matmul_peak(device, torch.bfloat16 if p == "bf16" else torch.float32) for _, p, _ in variants}
    overrides = {"num_layers": args.layers}
    rows = {}
    for preset in [p.strip() for p in args.presets.split(",") if p.strip()]:
        err = check_same_outputs(preset, overrides)
        common = dict(preset=preset, batch_size=args.batch_size, device=args.device, overrides=overrides,
                      reps=args.reps)
        rows[preset] = (err, measure(preset, variants, common, args.rounds))
    lines = table(rows, peaks, args, info)
    print("\n".join(lines))
    name = re.sub(r"[^A-Za-z0-9]+", "-", info.get("gpu", info["cpu"])).strip("-").lower()
    out = Path(args.out) / f"{name}-{info['cores']}cores-{info['date']}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
