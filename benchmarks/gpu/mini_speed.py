"""The mini presets' training speed on a lent GPU, step kernel by step kernel, in one short job.

    python3 benchmarks/gpu/mini_speed.py --out "$OUT" [--device cuda] [--presets quadratic-mini,learned-mini]
        [--rows eager,reduce-overhead,...] [--profile] [--batch-size 100] [--precision bf16]
        [--warmup 5] [--steps 50] [--budget 420] [--row-limit SECONDS] [--layers N]

The mini presets (width 64, 6 layers, 9 heads, 16x16 tokens) train far below what a GPU does with a
step of about 0.5 GFLOP per image: kernel launches and Python set their pace. Each row times one
way of taking the trainer's step (``benchmarks/gpu/mini_rows.py`` says how each is built, timed and
checked): ``eager`` (today's step, the layers' own attention path), ``compile`` (today's
``--compile``), ``reduce-overhead`` (``--compile-mode reduce-overhead``: CUDA graphs),
``reduce-overhead+fused`` (with ``--fused-optimizer``) and ``whole-step`` (forward, backward and the
optimizer's step in one CUDA-graph compiled function, the learning rate a 0-dim tensor); with
``--profile``, a ``profile`` row per preset puts the eager step under ``torch.profiler``: the
device's kernel time against the wall time (the idle share), launches per step, the 15 largest
kernels. Each row runs in a process of its own (its compilation and CUDA graphs cannot reach the
next row), one after the other, in the order of :func:`plan`: the eager rows and CUDA graphs of
both presets first, so that a job cut short still has what decides.

For every row: training images/s, the ratio to the ``eager`` row of its preset in the same job, peak
memory (CUDA), the first step's seconds (the compilation) and the whole warm-up's, dynamo's graphs
and graph breaks and any recompilation during the timed steps, and the row's 3 steps from the
same weights and batches against the eager step's: the largest weight difference (and loss
difference) with the bf16 bound it is judged against (``mini_rows.py`` derives it). After every row,
``mini-speed.md`` (the table, GPU, torch and precision named; the profiles below it) and
``mini-speed.json`` (every number) are written again to ``--out``; a row that would pass
``--budget`` seconds is not started (the table says so), one that runs on is stopped with its
processes at ``--row-limit`` (default three times its assumed seconds, :data:`ROW_SECONDS`) or the
budget's end.

A trial on a CPU (the script, not a measurement: inductor skips CUDA graphs there, and the table's
rows say so): ``--device cpu --batch-size 8 --steps 3 --warmup 2 --budget 300 --layers 1``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from row_process import run_limited

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PRESETS = ("quadratic-mini", "learned-mini")
#: seconds a row is assumed to take (process start, compilation, timing), for the budget
ROW_SECONDS = {"eager": 30.0, "profile": 30.0, "compile": 90.0, "reduce-overhead": 90.0,
               "reduce-overhead+fused": 90.0, "whole-step": 150.0}
#: the order of a job's rows: what decides the goal first
ORDER = ("eager", "reduce-overhead", "profile", "whole-step", "reduce-overhead+fused", "compile")
ROW_LIMIT_FACTOR = 3.0


def plan(presets: list[str], rows: list[str], profile: bool) -> list[tuple[str, str]]:
    """``(preset, row)`` in the job's order: row kind by row kind (:data:`ORDER`), each for every
    preset; ``profile`` rows only where asked."""
    wanted = [r for r in ORDER if r in rows or (r == "profile" and profile)]
    return [(preset, row) for row in wanted for preset in presets]


def run_row(preset: str, row: str, args: argparse.Namespace, limit: float, why: str) -> dict:
    """One row's result from its own process, or ``{"error": ...}``; stopped (SIGKILL to its process
    group: the compiler's workers too) after ``limit`` seconds, the error saying so and ``why``."""
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "row.json"
        cmd = [sys.executable, str(HERE / "mini_rows.py"), "--preset", preset, "--row", row, "--result", str(result),
               "--device", args.device, "--batch-size", str(args.batch_size), "--precision", args.precision,
               "--warmup", str(args.warmup), "--steps", str(args.steps)] + (
                   ["--layers", str(args.layers)] if args.layers else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        done = run_limited(cmd, env, ROOT, limit, merge_stderr=True)
        if done.stopped:
            return {"preset": preset, "row": row, "seconds": done.seconds,
                    "error": f"stopped after {done.seconds:.0f} s ({why})"}
        output, seconds = done.stdout, done.seconds
        if done.returncode != 0 or not result.is_file():
            tail = [line for line in output.strip().splitlines() if line.strip()][-1:]
            return {"preset": preset, "row": row, "seconds": seconds,
                    "error": " / ".join(tail) or f"exit {done.returncode}"}
        # the row's log (inductor's warnings: a graph left out of CUDA graphs says why there)
        return {**json.loads(result.read_text()), "seconds": seconds, "log_tail": output[-3000:]}


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def row_line(r: dict, eager: dict) -> str:
    """One row of the table (a failed one says why)."""
    name = f"| `{r['preset']}` | {r['row']} |"
    if "error" in r:
        return f"{name} - | failed: {r['error'][:200]} | - | - | - | - | - | - | - | - | - | {r['seconds']:.0f} |"
    base = eager.get(r["preset"])
    ratio = f"{r['images_per_s'] / base:.2f}x" if base else "-"
    paths = ", ".join(sorted(set(r["paths"]))) or "-"
    exact = ("yes" if r["exact"] else "**no**") + (f"; {r['note']}" if r["note"] else "")
    return (f"{name} {paths} | {r['images_per_s']:,.0f} | {ratio} | {r['step_ms']:.2f} | {r['first_step_s']:.1f} | "
            f"{r['warmup_s']:.1f} | {_mib(r['peak_memory_bytes'])} | {r['graphs']} / {r['graph_breaks']} / "
            f"{r['recompiled_in_timing']} | {r['param_diff'] / r['param_scale']:.1e} "
            f"({r['param_bound'] / r['param_scale']:.1e}) | {r['loss_diff']:.1e} ({r['loss_bound']:.1e}) | {exact} | "
            f"{r['seconds']:.0f} |")


def profile_lines(r: dict) -> list[str]:
    """A preset's eager profile: wall and busy time per step, launches, the largest kernels."""
    if "error" in r:
        return [f"### `{r['preset']}` eager step: profile failed: {r['error'][:300]}", ""]
    idle = f", idle {100 * r['idle_share']:.0f} % of the wall time" if r["idle_share"] is not None else ""
    launches = f", {r['launches_per_step']:.0f} kernel launches" if r["launches_per_step"] is not None else ""
    lines = [f"### `{r['preset']}` eager step: {r['wall_ms']:.2f} ms wall, {r['what']} {r['busy_ms']:.2f} ms{idle}"
             f"{launches}, {r['calls_per_step']:.0f} {r['what']} calls per step", "",
             f"| {r['what']} (top {len(r['top'])}) | calls/step | ms/step | share |", "|---|---:|---:|---:|"]
    for k in r["top"]:
        name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
        lines.append(f"| `{name.replace('|', '/')}` | {k['calls']:.0f} | {k['ms']:.3f} | {100 * k['share']:.1f} % |")
    return lines + [""]


def machine(results: list[dict]) -> dict:
    """The job's machine as its first row that ran saw it (:func:`mini_rows.machine`), or ``{}``."""
    return next((r["machine"] for r in results if "machine" in r), {})


def report(results: list[dict], skipped: list[tuple[str, str, str]], args: argparse.Namespace) -> str:
    """``mini-speed.md``: the header, the rows' table, the rows not run, then the profiles."""
    eager = {r["preset"]: r["images_per_s"] for r in results if r["row"] == "eager" and "error" not in r}
    info = machine(results)
    where = (f"{info['gpu']}, CUDA {info.get('cuda')}" if "gpu" in info
             else f"{info.get('cpu', 'machine unknown')} ({args.device})")
    lines = [f"# Mini presets' training step: {where}, torch {info.get('torch', '?')}, "
             f"{datetime.date.today().isoformat()}", "",
             f"`benchmarks/gpu/mini_speed.py`: {args.precision}, batch {args.batch_size}, {args.warmup} warm-up and "
             f"{args.steps} timed steps per row{f', {args.layers} layer(s)' if args.layers else ''}; random 3x32x32 "
             "images; each row in its own process. Exactness: the row's weights and losses after 3 steps from the "
             "same weights and batches against the eager bf16 step's, largest difference per largest weight "
             "(bound in brackets: mini_rows.py), loss difference (bound).", "",
             "| preset | row | paths | train img/s | vs eager | ms/step | first step s | warm-up s | peak MiB "
             "| graphs / breaks / recompiled in timing | weights diff (bound) | loss diff (bound) | exact | row s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|"]
    lines += [row_line(r, eager) for r in results if r["row"] != "profile"]
    lines += [f"| `{preset}` | {row} | - | not run: {why} | - | - | - | - | - | - | - | - | - | - |"
              for preset, row, why in skipped]
    profiles = [r for r in results if r["row"] == "profile"]
    if profiles:
        lines += ["", "## Profile of the eager step", ""]
        for r in profiles:
            lines += profile_lines(r)
    return "\n".join(lines) + "\n"


def write(out: Path, results: list[dict], skipped: list, args: argparse.Namespace) -> None:
    """``mini-speed.json`` (every number) and ``mini-speed.md`` (:func:`report`) in ``out``, again."""
    (out / "mini-speed.json").write_text(json.dumps({"machine": machine(results), "args": vars(args),
                                                     "results": results, "skipped": skipped}, indent=1))
    (out / "mini-speed.md").write_text(report(results, skipped, args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder of mini-speed.md and mini-speed.json ($OUT)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--rows", default=",".join(r for r in ORDER if r != "profile"),
                        help=f"comma-separated, of {', '.join(r for r in ORDER if r != 'profile')}")
    parser.add_argument("--profile", action="store_true", help="also profile each preset's eager step")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--warmup", type=int, default=5, help="steps after the 3 exactness steps (>= 2: a "
                        "CUDA graph is recorded on its second call, the whole step recompiles once its "
                        "optimizer has state)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per row")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds; rows that would pass it are skipped")
    parser.add_argument("--row-limit", type=float, metavar="SECONDS", help="stop a row after this long "
                        f"(default: {ROW_LIMIT_FACTOR:g}x its assumed seconds)")
    parser.add_argument("--layers", type=int, help="the presets with this many layers (a quick trial)")
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - (set(ROW_SECONDS) - {"profile"}))
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)}; use {', '.join(r for r in ORDER if r != 'profile')} "
                     "(--profile adds the profile rows)")
    if args.warmup < 2 or args.steps < 1:
        parser.error("--warmup must be at least 2 and --steps at least 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start, results, skipped = time.monotonic(), [], []
    for preset, row in plan(args.presets.split(","), rows, args.profile):
        elapsed = time.monotonic() - start
        if elapsed + ROW_SECONDS[row] > args.budget:
            skipped.append((preset, row, f"the {args.budget:.0f} s budget ({elapsed:.0f} s used)"))
            continue
        own = args.row_limit or ROW_LIMIT_FACTOR * ROW_SECONDS[row]
        limit, why = (own, "the row limit") if own <= args.budget - elapsed else (
            args.budget - elapsed, f"the {args.budget:.0f} s budget")
        results.append(run_row(preset, row, args, limit, why))
        r = results[-1]
        print(f"{preset} {row}: " + (r.get("error") or (f"{r['images_per_s']:,.0f} img/s" if row != "profile"
                                                        else f"{r['wall_ms']:.1f} ms wall"))
              + f" ({r['seconds']:.0f} s)", flush=True)
        write(out, results, skipped, args)
    write(out, results, skipped, args)
    return 0 if results and all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
