"""Seconds from ``attncnn train`` to its first training step, for two checkouts side by side.

Why: a change to how a run is planned (reading the recipe, choosing paths and compiling, loading the
data) must not make a user wait longer before training starts. Each round starts ``attncnn train``
once per checkout, alternating, and reads the time at which the run logs its ``preset ...`` line:
the loop's first step follows it directly (``training/loop.py``). Every start gets a fresh cache
folder (``$ATTNCNN_DATA_DIR`` and ``$ATTNCNN_CACHE_DIR``), so each pays what a first run on a new
machine pays (decoding; before the written rule, path timing and the compile probe), unless
``--warm`` gives every start of a checkout the same folder.

    python benchmarks/first_step.py --src OLD/src --src NEW/src --rounds 3 --out benchmarks/results/x.md

The data set is a small image folder made once (3 classes of 32x32 PNGs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

#: what the run logs just before its first step (training/loop.py, _train)
MARKER = "preset demo:"


def tiny_images(root: Path, per_class: int = 40) -> Path:
    """An image folder of 3 classes, ``per_class`` train and 10 test 32x32 PNGs each."""
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", 10)):
        for c, name in enumerate(("a", "b", "c")):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def time_to_first_step(src: Path, data: Path, cache: Path, out: Path, extra: list[str]) -> float:
    """Seconds from starting ``python -m attncnn train --preset demo`` with ``src`` first on the path
    to its :data:`MARKER` line on stderr (the process is stopped there)."""
    # the data cache and the cache of measured choices (a checkout that keeps them in the data
    # folder ignores the second)
    env = {**os.environ, "PYTHONPATH": str(src), "ATTNCNN_DATA_DIR": str(cache), "ATTNCNN_CACHE_DIR": str(cache)}
    cmd = [sys.executable, "-m", "attncnn", "train", "--preset", "demo", "--data", str(data), "--epochs", "2",
           "--out", str(out), "--no-progress", *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stderr:
            if line.startswith(MARKER):
                return time.perf_counter() - start
        raise RuntimeError(f"{src}: the run ended without logging {MARKER!r} (exit status {proc.wait()})")
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", required=True, help="a checkout's src/ folder (give two)")
    parser.add_argument("--label", action="append", help="a name per --src (default: the folder)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", action="store_true", help="one cache folder per checkout for all its starts")
    parser.add_argument("--out", help="also write the table to this Markdown file")
    parser.add_argument("extra", nargs="*", help="more `attncnn train` flags, after --")
    args = parser.parse_args()
    labels = args.label or [str(Path(s).resolve().parent.name) for s in args.src]
    times: dict[str, list[float]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tiny_images(tmp / "data")
        for r in range(args.rounds):
            for label, src in zip(labels, args.src):
                cache = tmp / ("cache-" + label if args.warm else f"cache-{label}-{r}")
                seconds = time_to_first_step(Path(src), data, cache, tmp / f"run-{label}-{r}", args.extra)
                times[label].append(seconds)
                print(f"round {r + 1} {label}: {seconds:.2f} s", flush=True)
    base = statistics.median(times[labels[0]])
    rows = ["| checkout | seconds to the first step (each round) | median | vs first |", "|---|---|---:|---:|"]
    for label in labels:
        med = statistics.median(times[label])
        rows.append(f"| {label} | {', '.join(f'{t:.2f}' for t in times[label])} | {med:.2f} | {med / base:.2f}x |")
    table = "\n".join(rows)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
