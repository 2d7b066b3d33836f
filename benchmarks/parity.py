"""Accuracy and fp32 parity with a frozen baseline commit (the speed work's "accuracy parity" goal).

    python benchmarks/parity.py --data ../shared/data/cifar10-jpeg.zip
        [--baseline c82d29a] [--presets demo,quadratic-mini,learned-content-mini] [--seeds 0,1,2]
        [--train-images 5000] [--test-images 2000] [--out benchmarks/results]

Two checks, each with the baseline's source (``git archive <baseline> src``, as ``speedup.py``) and
this checkout's, in fresh processes:

1. **fp32 outputs and gradients.** Each preset is built with ``torch.manual_seed(0)`` (so both codes
   start from the same weights, as long as the baseline creates its parameters in the same order),
   run in float32 on 8 seeded random images in eval mode (no dropout masks; gradients still
   flow), and the logits and every parameter's
   gradient of the summed logits are compared: the largest relative difference over all of them,
   ``max |new - base| / max |base|`` per tensor. The goal is 1e-6; float32 sums in another order
   (another attention path) differ by a few units of 1e-7.
2. **Accuracy after one epoch.** ``attncnn train --epochs 1`` per seed, same class-balanced subset of
   the data for both codes, ``--precision auto``: the final test accuracy per seed and code, the
   seed-to-seed spread (max - min over seeds) of the baseline and the largest |new - baseline| at the
   same seed. Parity holds when the same-seed differences are within the baseline's spread.

Prints a Markdown table (and writes it to ``--out`` named after the machine and date).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# a sibling script: `python benchmarks/parity.py` puts benchmarks/ first on sys.path
from speedup import REPO, _cpu, extract_baseline, subset_zip

#: run in a fresh process under each code's PYTHONPATH: weights from seed 0, logits and gradients saved
PROBE = """
import sys, torch
from attncnn.models import build_model
from safetensors.torch import save_file
preset, path = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = build_model(preset).float().eval()          # eval: no dropout masks; gradients still flow
torch.manual_seed(1)
x = torch.randn(8, 3, 32, 32)
logits = model(x)
logits.sum().backward()
out = {"logits": logits.detach().contiguous()}
out.update({"grad." + n: p.grad.detach().contiguous() for n, p in model.named_parameters() if p.grad is not None})
save_file(out, path)
"""


def probe(src: Path, preset: str, path: Path) -> dict:
    """:data:`PROBE` run with ``src`` first on PYTHONPATH; ``{"logits": (8, classes), "grad.<name>": ...}``
    read back from ``path``. Raises ``subprocess.CalledProcessError`` if that code cannot build ``preset``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-c", PROBE, preset, str(path)], env=env, check=True, capture_output=True,
                   text=True)
    from safetensors.torch import load_file
    return load_file(str(path))


def fp32_difference(base: dict, new: dict) -> tuple[float, str]:
    """Largest ``max|new - base| / max|base|`` over the tensors both have, and which tensor.

    Raises:
        ValueError: the two codes' tensors differ in names or shapes (not the same model).
    """
    if base.keys() != new.keys() or any(base[k].shape != new[k].shape for k in base):
        raise ValueError(f"baseline and new code build different models: {sorted(set(base) ^ set(new))[:5]}")
    worst, name = 0.0, ""
    for key, b in base.items():
        scale = b.abs().max().item()
        diff = (new[key] - b).abs().max().item() / (scale if scale > 0 else 1.0)
        if diff > worst:
            worst, name = diff, key
    return worst, name


def train_accuracy(src: Path, preset: str, data: Path, out: Path, seed: int) -> float:
    """Final test accuracy (fraction) of ``attncnn train --epochs 1`` with ``src``'s code into ``out``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-m", "attncnn", "train", "--preset", preset, "--data", str(data), "--out", str(out),
           "--epochs", "1", "--checkpoint-every", "0", "--no-progress", "--seed", str(seed),
           "--data-dir", str(out.parent / "cache")]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "test_accuracy" in r][-1]["test_accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="an image zip with train/<class>/ and test/<class>/")
    parser.add_argument("--baseline", default="c82d29a")
    parser.add_argument("--presets", default="demo,quadratic-mini,learned-content-mini")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--train-images", type=int, default=5000)
    parser.add_argument("--test-images", type=int, default=2000)
    parser.add_argument("--out", help="folder for the Markdown result")
    args = parser.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    lines = [f"Parity with {args.baseline}: fp32 logits and gradients (8 random images, weights of seed 0) and "
             f"test accuracy after 1 epoch of {args.train_images} training images ({args.test_images} test "
             f"images, --precision auto); {_cpu()}, {os.cpu_count()} cores, {datetime.date.today().isoformat()}",
             "", "| preset | fp32 max relative difference (tensor) | "
             + " | ".join(f"seed {s} base / new" for s in seeds)
             + " | baseline spread | largest same-seed difference |", "|---|---|" + "---|" * len(seeds) + "---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        codes = {"baseline": extract_baseline(args.baseline, tmp), "new": REPO / "src"}
        data = subset_zip(Path(args.data), tmp, args.train_images, args.test_images)
        for preset in presets:
            tensors = {code: probe(src, preset, tmp / f"{preset}-{code}.safetensors") for code, src in codes.items()}
            worst, name = fp32_difference(tensors["baseline"], tensors["new"])
            accuracy = {(code, seed): train_accuracy(src, preset, data, tmp / f"{preset}-{code}-{seed}", seed)
                        for seed in seeds for code, src in (codes.items() if seed % 2 == 0
                                                            else list(codes.items())[::-1])}
            base = [accuracy[("baseline", s)] for s in seeds]
            spread = max(base) - min(base)
            largest = max(abs(accuracy[("new", s)] - accuracy[("baseline", s)]) for s in seeds)
            row = (f"| `{preset}` | {worst:.1e} (`{name}`) | "
                   + " | ".join(f"{100 * accuracy[('baseline', s)]:.2f} / {100 * accuracy[('new', s)]:.2f}"
                                for s in seeds)
                   + f" | {100 * spread:.2f} | {100 * largest:.2f} |")
            lines.append(row)
            print(row, flush=True)
    print("\n".join(lines))
    if args.out:
        name = "".join(c if c.isalnum() else "-" for c in _cpu().lower()).strip("-")
        path = Path(args.out) / f"parity-{name}-{os.cpu_count()}cores-{datetime.date.today().isoformat()}.md"
        Path(args.out).mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
