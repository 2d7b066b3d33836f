"""Side by side through the real trainer: today's code against a frozen baseline commit.

    python benchmarks/speedup.py --data ../shared/data/cifar10-jpeg.zip
        [--baseline c82d29a] [--presets quadratic-mini,learned-mini,...] [--rounds 2]
        [--train-images 3000] [--test-images 1000] [--set KEY=VALUE ...] [--out benchmarks/results]

For each preset and round, ``attncnn train`` runs twice in fresh processes, once with the baseline's
source (``git archive <baseline> src`` extracted into a temporary folder, put first on PYTHONPATH)
and once with this checkout's, in alternating order, on the same class-balanced subset of the data
(``--train-images`` training and ``--test-images`` test images copied into a temporary zip), two
epochs, batch 100, ``--precision auto`` and the preset's recipe, a data cache (decoded images, the
measured attention paths) inside the temporary folder. Training speed is the images/s of
epoch 2 (so compile warm-up and first-touch costs are excluded), evaluation speed the test images
per second of epoch 2's evaluation. Printed per preset: both medians, their ratio and the attention
path each new run measured and trained with; with ``--out`` a Markdown file named after the machine
and date is written there too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PRESETS = ("quadratic-mini", "learned-mini", "quadratic-generalized-mini", "gpsa-mini",
                   "learned-content-mini", "resnet18-mini")


def extract_baseline(rev: str, dest: Path) -> Path:
    """The baseline's ``src`` folder, from ``git archive`` (the working tree is not touched)."""
    archive = dest / "baseline.tar"
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest / "baseline", filter="data")
    return dest / "baseline" / "src"


def subset_zip(source: Path, dest: Path, train: int, test: int) -> Path:
    """A zip with the first ``train`` / ``test`` images of ``source``'s splits, balanced over classes."""
    with zipfile.ZipFile(source) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        out = dest / "subset.zip"
        with zipfile.ZipFile(out, "w") as w:
            for split, count in (("train", train), ("test", test)):
                files = [n for n in names if f"{split}/" in n]
                classes = sorted({n.split(f"{split}/", 1)[1].split("/", 1)[0] for n in files})
                per_class = count // len(classes)
                for c in classes:
                    for n in sorted(f for f in files if f.split(f"{split}/", 1)[1].startswith(c + "/"))[:per_class]:
                        w.writestr(f"{split}/{c}/{Path(n).name}", z.read(n))
    return out


def run_once(src: Path, preset: str, data: Path, out: Path, extra: list[str]) -> dict:
    """One 2-epoch training run; returns epoch 2's training and evaluation images/s."""
    # the user cache folder too (where the code before the written rule cached its measured choices):
    # never this machine's own
    env = {**os.environ, "PYTHONPATH": str(src), "ATTNCNN_CACHE_DIR": str(out.parent / "user-cache")}
    cmd = [sys.executable, "-m", "attncnn", "train", "--preset", preset, "--data", str(data), "--out", str(out),
           "--epochs", "2", "--checkpoint-every", "0", "--no-progress", "--seed", "0",
           "--data-dir", str(out.parent / "cache"), *extra]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r.get("epoch") == 2][-1]
    tested = last.get("test_images") or last.get("test_count")
    impl = _paths(out)
    return {"train": last["images_per_second"], "eval_seconds": last.get("eval_seconds"), "tested": tested,
            "path": impl}


def _paths(run: Path) -> str:
    """The first attention layer's paths, training / test pass, of the run's last ``machine.json``
    segment (older runs: ``config.json``'s ``model.impl``), or ``-``."""
    machine = run / "machine.json"
    if machine.is_file():
        paths = (json.loads(machine.read_text()).get("segments") or [{}])[-1].get("attention_paths")
        if paths:
            return f"{paths['train'][0]} / {paths['test'][0]}"
        return "-"
    return json.loads((run / "config.json").read_text()).get("model", {}).get("impl", "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="an image zip with train/<class>/ and test/<class>/")
    parser.add_argument("--baseline", default="c82d29a")
    parser.add_argument("--presets", default=",".join(DEFAULT_PRESETS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train-images", type=int, default=3000)
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model option, new code only")
    parser.add_argument("--new-args", default="", help="extra `attncnn train` flags for the new code only")
    parser.add_argument("--with-compile", action="store_true",
                        help="also time this checkout with --compile (epoch 2 excludes the compile warm-up)")
    parser.add_argument("--out", help="folder for the Markdown result")
    args = parser.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base_src = extract_baseline(args.baseline, tmp)
        data = subset_zip(Path(args.data), tmp, args.train_images, args.test_images)
        new_extra = [f for kv in args.set for f in ("--set", kv)] + args.new_args.split()
        codes = {"baseline": (base_src, []), "new": (REPO / "src", new_extra)}
        if args.with_compile:
            codes["new+compile"] = (REPO / "src", [*new_extra, "--compile"])
        found: dict[tuple[str, str], list[dict]] = {}
        for r in range(args.rounds):
            for preset in presets:
                for code in (list(codes) if r % 2 == 0 else list(codes)[::-1]):
                    src, extra = codes[code]
                    result = run_once(src, preset, data, tmp / f"{preset}-{code}-{r}", extra)
                    found.setdefault((preset, code), []).append(result)
                    print(f"round {r + 1} {preset} {code}: {result['train']:.1f} train img/s, "
                          f"eval {result['eval_seconds']:.2f} s, path {result['path']}", flush=True)
    lines = _table(found, presets, args, list(codes)[1:])
    print("\n".join(lines))
    if args.out:
        print(f"wrote {write_result(args.out, 'speedup', lines)}")


def _table(found, presets, args, variants: list[str]) -> list[str]:
    def med(preset, code, key):
        values = [r[key] for r in found[(preset, code)]]
        return statistics.median(values) if key == "train" else args.test_images / statistics.median(values)

    head = "| preset | train img/s baseline |" + "".join(f" {v} | ratio |" for v in variants)
    head += " eval img/s baseline |" + "".join(f" {v} | ratio |" for v in variants)
    head += "".join(f" path {v} |" for v in variants)
    lines = [f"`attncnn train` epoch 2, {args.train_images} training / {args.test_images} test images, "
             f"batch 100, --precision auto, median of {args.rounds} alternated rounds; baseline {args.baseline}; "
             f"{_cpu()}, {os.cpu_count()} cores, {datetime.date.today().isoformat()}", "", head,
             "|---|" + "---:|" * (2 + 4 * len(variants)) + "---|" * len(variants)]
    for p in presets:
        row = f"| `{p}` |"
        for key in ("train", "eval_seconds"):
            base = med(p, "baseline", key)
            row += f" {base:.1f} |" + "".join(f" {med(p, v, key):.1f} | {med(p, v, key) / base:.2f}x |"
                                             for v in variants)
        # the attention paths each round's run trained and evaluated with (machine.json)
        row += "".join(f" {', '.join(r['path'] for r in found[(p, v)])} |" for v in variants)
        lines.append(row)
    return lines


def write_result(folder: str | Path, kind: str, lines: list[str]) -> Path:
    """Write ``lines`` to ``folder/<kind>-<cpu>-<cores>cores-<date>.md``; a second measurement the
    same day gets ``-2``, ``-3``, ... and keeps the first."""
    name = "".join(c if c.isalnum() else "-" for c in _cpu().lower()).strip("-")
    stem = f"{kind}-{name}-{os.cpu_count()}cores-{datetime.date.today().isoformat()}"
    Path(folder).mkdir(parents=True, exist_ok=True)
    path, n = Path(folder) / f"{stem}.md", 1
    while path.exists():
        n += 1
        path = Path(folder) / f"{stem}-{n}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
