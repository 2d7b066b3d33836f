"""Side by side: a test pass (forward, eval mode, no gradients) of presets at large batches, with a
frozen baseline commit's source and with this checkout's, each in a fresh process.

    python benchmarks/eval_memory.py [--baseline 88fd6f8] [--presets learned-content-mini,quadratic-mini]
        [--batch-sizes 250,500] [--images 1000] [--layers 0] [--rounds 1] [--out benchmarks/results]

What it is for: the host memory policy (``attncnn.perf.host_memory``) decides whether the large
tensors a pass frees are reused or given back to the system and zero-filled again on the next
touch, which only shows at batches whose layers free gigabytes at once. Each process calls
``reuse_freed_memory()`` (as ``attncnn evaluate`` and ``train`` do on a CPU), builds the preset with
seed 0 (or loads ``results/mini/<preset>/seed0``'s final weights with ``--trained``: a trained
quadratic layer's sharp softmax has subnormal entries that random weights lack), keeps the first
``--layers`` blocks (0: all), runs one warm-up batch, then times ``--images`` random images in
batches of each size in turn. Printed per preset, batch and source: images/s, and the process's
system seconds and minor page faults (``resource.getrusage``), with the ratio of the
new images/s to the baseline's; with ``--out`` a Markdown file named after the machine and date.
Rounds alternate which source runs first.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from speedup import REPO, _cpu, extract_baseline, write_result

_WORKER = """
import json, resource, sys, time, torch
from attncnn.perf.host_memory import reuse_freed_memory
from attncnn.models import build_model
from attncnn.runs import load_model
policy = reuse_freed_memory()
preset, batch, images, layers, trained = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.manual_seed(0)
model = load_model(trained, "cpu")[0] if trained else build_model(preset)
if layers:
    model.blocks = model.blocks[:layers]
model.eval()
x = torch.randn(images, 3, 32, 32)
with torch.no_grad():
    model(x[:batch])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    for i in range(0, images, batch):
        model(x[i:i + batch])
    took = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"policy": policy, "images_per_second": images / took,
                  "system_seconds": after.ru_stime - usage.ru_stime,
                  "minor_faults": after.ru_minflt - usage.ru_minflt}))
"""


def _measure(src: Path, preset: str, batch: int, images: int, layers: int, trained: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", _WORKER, preset, str(batch), str(images), str(layers), trained],
                         env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="88fd6f8")
    parser.add_argument("--presets", default="learned-content-mini,quadratic-mini")
    parser.add_argument("--batch-sizes", default="250,500")
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=0, help="keep the first N blocks (0: all)")
    parser.add_argument("--trained", action="store_true", help="results/mini/<preset>/seed0's final weights")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="folder for the Markdown result")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"baseline": extract_baseline(args.baseline, Path(tmp)), "new": REPO / "src"}
        for preset in args.presets.split(","):
            trained = str(REPO / "results" / "mini" / preset / "seed0") if args.trained else ""
            for batch in (int(b) for b in args.batch_sizes.split(",")):
                runs = {"baseline": [], "new": []}
                for r in range(args.rounds):
                    for name in (("baseline", "new") if r % 2 == 0 else ("new", "baseline")):
                        runs[name].append(_measure(sources[name], preset, batch, args.images, args.layers, trained))
                        print(preset, batch, name, runs[name][-1], flush=True)
                med = {name: {k: statistics.median(m[k] for m in ms) for k in ("images_per_second", "system_seconds",
                                                                              "minor_faults")}
                       for name, ms in runs.items()}
                rows.append((preset, batch, med))
    what = (f"test pass, {args.images} random images, {'trained weights' if args.trained else 'seed-0 weights'}, "
            f"{'all' if not args.layers else args.layers} layers, fp32, median of {args.rounds} alternated rounds; "
            f"baseline {args.baseline}; {_cpu()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{datetime.date.today().isoformat()}")
    lines = [what, "", "| preset | batch | img/s baseline | new | ratio | system s baseline | new "
             "| minor faults baseline | new |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for preset, batch, med in rows:
        b, n = med["baseline"], med["new"]
        lines.append(f"| `{preset}` | {batch} | {b['images_per_second']:.1f} | {n['images_per_second']:.1f} | "
                     f"{n['images_per_second'] / b['images_per_second']:.2f}x | {b['system_seconds']:.1f} | "
                     f"{n['system_seconds']:.1f} | {b['minor_faults']:,.0f} | {n['minor_faults']:,.0f} |")
    print("\n".join(lines))
    if args.out:
        print(f"wrote {write_result(args.out, 'eval-memory', lines)}")


if __name__ == "__main__":
    main()
