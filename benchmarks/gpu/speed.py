"""Training speed on a lent GPU, this checkout against an earlier one, in one short job.

    python3 benchmarks/gpu/speed.py --out "$OUT" [--baseline .gpu/baseline/src] [--device cuda]
                                    [--batch-size 100] [--budget 300] [--layers N] [--rows quick|full|content]
                                    [--precision bf16] [--row-limit SECONDS]

Each row is one ``attncnn bench`` of a preset in bf16 (``--precision fp32`` for a device without
fast bf16), in its own process (``python -m attncnn bench --json``: the preset's images/s for a
training step and a test pass, peak memory and the attention paths it took), eager or
``torch.compile``d, with the attention path left to the run's own measurement (``auto``) or named
(``--set impl=...``). The ``before`` rows run the same command
on the code in ``--baseline`` (a ``src`` folder of an earlier commit: ``git archive <commit> src``),
so both sides run on the same GPU in the same job: the ratios in the table are to the eager
``before`` row of the same preset. Rows run one after the other (one GPU), and a row is skipped,
with the reason in the table, when it would pass ``--budget`` seconds (compiled rows are
assumed to take 90 s, eager ones 40 s). A row that runs on is stopped, with its processes, at
``--row-limit`` seconds (default: three times its assumed time) or where the budget ends, whichever
comes first, and the table says so: one row whose compilation stalls (a kernel autotuned for a
shape it was not made for) cannot take the rows after it with it. After every row the table is
written again to ``--out/gpu-speed.md`` (and the raw results to ``gpu-speed.json``), so a job
stopped at its time limit still brings back what it measured.

On a CPU, for a trial of the job before it goes: ``--device cpu --batch-size 4 --layers 1`` (and
``--precision fp32`` on a CPU without bf16 units, where bf16 products run about 100x slower).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from row_process import run_limited

ROOT = Path(__file__).resolve().parents[2]
#: seconds a row is assumed to take, for the budget (process start, paths, FLOP count, timing)
ROW_SECONDS = {False: 40.0, True: 90.0}
#: a row is stopped after this many times its assumed seconds (``--row-limit`` overrides it)
ROW_LIMIT_FACTOR = 3.0


@dataclass(frozen=True)
class Row:
    """One benchmark: which code, preset, attention path (None: the run's own choice), compiled or not."""

    code: str
    preset: str
    impl: str | None = None
    compile: bool = False

    @property
    def label(self) -> str:
        return f"{self.code} {self.preset} {self.impl or 'auto'}{' compiled' if self.compile else ''}"


def plan(kind: str) -> list[Row]:
    """The rows of a job: ``quick`` (the baseline, the run's own choice eager and compiled), ``full``
    (those, then every content-attention path eager and the likely ones compiled), or ``content``
    (``learned-content`` alone: baseline, own choice eager and compiled, the bilinear and one-hot
    paths compiled: what decides how long a run of it a job fits)."""
    if kind == "content":
        return [Row("before", "learned-content"), Row("after", "learned-content"),
                Row("after", "learned-content", compile=True),
                Row("after", "learned-content", "bilinear", compile=True),
                Row("after", "learned-content", "explicit-onehot", compile=True)]
    rows = [Row("before", "quadratic"), Row("before", "learned-content"),
            Row("after", "quadratic"), Row("after", "quadratic", compile=True),
            Row("after", "learned-content"), Row("after", "learned-content", compile=True)]
    if kind == "full":
        rows += [Row("after", "learned-content", impl) for impl in
                 ("explicit-half", "explicit-onehot", "bilinear", "sdpa")]
        rows += [Row("after", "learned-content", impl, compile=True) for impl in ("explicit-onehot", "bilinear")]
    return rows


def command(row: Row, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The ``attncnn bench`` command line and environment of a row."""
    cmd = [sys.executable, "-m", "attncnn", "bench", "--presets", row.preset, "--device", args.device,
           "--batch-size", str(args.batch_size), "--variants", args.precision + ("+compile" if row.compile else ""),
           "--json"]
    if row.impl:
        cmd += ["--set", f"impl={row.impl}"]
    if args.layers:
        cmd += ["--layers", str(args.layers)]
    src = Path(args.baseline) if row.code == "before" else ROOT / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src.resolve())] + os.environ.get("PYTHONPATH", "").split(
        os.pathsep)).rstrip(os.pathsep)}
    return cmd, env


def run_row(row: Row, args: argparse.Namespace, limit: float | None = None, why: str = "") -> dict:
    """One row's result: the bench's numbers, or ``{"error": ...}``.

    ``limit``: seconds after which the row is stopped (SIGKILL to its whole process group: the
    compiler's workers too), its error saying after how long and ``why`` (e.g. "the row limit")."""
    cmd, env = command(row, args)
    done = run_limited(cmd, env, ROOT, limit)
    if done.stopped:
        return {"row": row.__dict__, "seconds": done.seconds,
                "error": f"stopped after {done.seconds:.0f} s{f' ({why})' if why else ''}"}
    stdout, seconds = done.stdout, done.seconds
    if done.returncode != 0:
        tail = (done.stderr or stdout).strip().splitlines()[-1:]     # the exception's own line
        return {"row": row.__dict__, "seconds": seconds, "error": " / ".join(tail) or f"exit {done.returncode}"}
    report = json.loads(stdout)
    (result,) = report["results"]
    return {"row": row.__dict__, "seconds": seconds, "machine": report["machine"], **result}


def row_limit(row: Row, args: argparse.Namespace, left: float) -> tuple[float, str]:
    """The seconds ``row`` may run, and why they end there: ``--row-limit`` (default
    :data:`ROW_LIMIT_FACTOR` times the row's assumed seconds), or the ``left`` seconds of the budget
    where those come first."""
    own = args.row_limit if args.row_limit is not None else ROW_LIMIT_FACTOR * ROW_SECONDS[row.compile]
    return (own, "the row limit") if own <= left else (left, f"the {args.budget:.0f} s budget")


def table(results: list[dict], skipped: list[tuple[Row, str]], args: argparse.Namespace) -> str:
    """The Markdown table: images/s per row, ratio to the eager ``before`` row of its preset."""
    base = {r["row"]["preset"]: r["train_images_per_s"] for r in results
            if r["row"]["code"] == "before" and not r["row"]["compile"] and "error" not in r}
    machine = next((r["machine"] for r in results if "machine" in r), {})
    lines = [f"`benchmarks/gpu/speed.py`: `attncnn bench` rows, {args.precision}, batch {args.batch_size}"
             f"{f', {args.layers} layer(s)' if args.layers else ''}; "
             + ", ".join(f"{k} {v}" for k, v in machine.items()), "",
             "| code | preset | path asked | paths taken (train / test) | compiled | train img/s | vs before, eager "
             "| test img/s | peak MiB | row s |", "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        row = Row(**r["row"])
        if "error" in r:
            lines.append(f"| {row.code} | {row.preset} | {row.impl or 'auto'} | - | {'yes' if row.compile else 'no'} "
                         f"| failed: {r['error'][:200]} | - | - | - | {r['seconds']:.0f} |")
            continue
        paths = r.get("attention_paths") or {}
        taken = " / ".join(", ".join(sorted(set(paths.get(m) or ["-"]))) for m in ("train", "eval"))
        ratio = r["train_images_per_s"] / base[row.preset] if row.preset in base else None
        asked = row.impl or "auto"
        lines.append(f"| {row.code} | {row.preset} | {asked} | {taken} | {'yes' if row.compile else 'no'} "
                     f"| {r['train_images_per_s']:,.0f} | {f'{ratio:.2f}x' if ratio else '-'} "
                     f"| {r['infer_images_per_s']:,.0f} | {r['peak_memory_bytes'] / 2**20:,.0f} | {r['seconds']:.0f} |")
    for row, why in skipped:
        lines.append(f"| {row.code} | {row.preset} | {row.impl or 'auto'} | - | {'yes' if row.compile else 'no'} "
                     f"| not run: {why} | - | - | - | - |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder of gpu-speed.md and gpu-speed.json ($OUT)")
    parser.add_argument("--baseline", default=".gpu/baseline/src", help="the earlier commit's src folder")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--layers", type=int, help="time the attention presets with this many layers")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds; rows that would pass it are skipped")
    parser.add_argument("--rows", choices=("full", "quick", "content"), default="full")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                        help="of every row (fp32: for a trial on a device without fast bf16)")
    parser.add_argument("--row-limit", type=float, metavar="SECONDS",
                        help=f"stop a row after this long (default: {ROW_LIMIT_FACTOR:g}x its assumed "
                             f"{ROW_SECONDS[False]:.0f} s eager, {ROW_SECONDS[True]:.0f} s compiled)")
    args = parser.parse_args(argv)
    if args.row_limit is not None and args.row_limit <= 0:
        parser.error(f"--row-limit must be a positive number of seconds, got {args.row_limit:g}")
    if not (Path(args.baseline) / "attncnn").is_dir():
        parser.error(f"--baseline {args.baseline} holds no attncnn package; make it with "
                     f"`mkdir -p .gpu/baseline && git archive <commit> src | tar -x -C .gpu/baseline`")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start, results, skipped = time.monotonic(), [], []
    for row in plan(args.rows):
        elapsed = time.monotonic() - start
        if elapsed + ROW_SECONDS[row.compile] > args.budget:
            skipped.append((row, f"the {args.budget:.0f} s budget"))
            continue
        results.append(run_row(row, args, *row_limit(row, args, args.budget - elapsed)))
        print(f"{row.label}: " + (results[-1].get("error") or f"{results[-1]['train_images_per_s']:,.0f} train img/s")
              + f" ({results[-1]['seconds']:.0f} s)", flush=True)
        (out / "gpu-speed.json").write_text(json.dumps(results, indent=2, default=str))
        (out / "gpu-speed.md").write_text(table(results, skipped, args))
    (out / "gpu-speed.md").write_text(table(results, skipped, args))
    return 0 if results and all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
