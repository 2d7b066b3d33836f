"""What ``attncnn train`` decides about compiling, preset by preset, on this machine.

    python benchmarks/compile_choice.py [--presets quadratic-mini,...] [--reps 5] [--out benchmarks/results]

For each preset: the attention path a run takes here by default (the written rule,
``attncnn.perf.rule.choose``), then the timing ``attncnn train --measure-compile`` makes
(``attncnn.perf.measure.time_compile``: training steps of the network at batch 100 on random 32 x 32
images, ``--precision auto``, eager and ``torch.compile``d, alternated, ``--reps`` timed steps each
after the warm-up), and the decision ``--measure-compile`` takes from those timings for the preset's
recipe on CIFAR-10 (its epochs x 500 steps) and for a 60-epoch run. These rows are what the rule's
compile table is derived from; its agreement with the trainer's own epoch speeds is checked
separately (``benchmarks/speedup.py --with-compile``).
Prints a Markdown table (and writes it to ``--out`` named after the machine and date). Run it with
nothing else on the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch

# a sibling script: `python benchmarks/compile_choice.py` puts benchmarks/ first on sys.path
from speedup import DEFAULT_PRESETS, _cpu, write_result

from attncnn.models import build_model, get_preset, preset_model_config
from attncnn.perf.host_memory import reuse_freed_memory
from attncnn.perf.measure import MIN_SPEEDUP, pays_back, time_compile
from attncnn.perf.precision import resolve_precision
from attncnn.perf.rule import choose, device_kind
from attncnn.runs import resolve_config
from attncnn.training import make_optimizer

STEPS_PER_EPOCH = 500           # CIFAR-10's 50,000 training images at batch 100


def measure(preset: str, reps: int) -> dict:
    """The path, the timings and the decisions for one preset."""
    precision = resolve_precision("auto", torch.device("cpu"))
    arch, model_config = preset_model_config(preset, 10)
    model = {}
    if hasattr(model_config, "attention"):
        grid = (32 // model_config.pooling, 32 // model_config.pooling)
        model = {"impl": choose(device_kind("cpu"), model_config.attention, grid, precision, 0).train_impl}
    torch.manual_seed(0)
    net = build_model(preset, 10, **model).train()
    config = resolve_config(preset, model=model, precision=precision)
    images, labels = torch.randn(100, 3, 32, 32), torch.randint(0, 10, (100,))
    timing = time_compile(net, make_optimizer(net, config), images, labels, precision=precision, reps=reps)
    recipe = get_preset(preset).train.get("epochs", config.epochs) * STEPS_PER_EPOCH
    return {"preset": preset, "path": model.get("impl", "-"), "precision": precision, "timing": timing,
            "recipe_steps": recipe, "recipe": pays_back(timing, recipe),
            "long": pays_back(timing, 60 * STEPS_PER_EPOCH)}


def table(rows: list[dict], reps: int) -> list[str]:
    lines = [f"`attncnn train --measure-compile`'s timing: one training step at batch 100 (32 x 32 images, "
             "--precision auto), "
             f"median of {reps} alternated steps per mode after the warm-up; compiled when it is >= "
             f"{MIN_SPEEDUP}x faster and the time saved over the run exceeds the warm-up; {_cpu()}, "
             f"{os.cpu_count()} cores, torch {torch.__version__}, {datetime.date.today().isoformat()}", "",
             "| preset | path | precision | eager ms | compiled ms | speedup | warm-up s | recipe (steps): compile? "
             "| 60 epochs: compile? |", "|---|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        t = r["timing"]
        lines.append(f"| `{r['preset']}` | {r['path']} | {r['precision']} | {1e3 * t.eager:.0f} | "
                     f"{1e3 * t.compiled:.0f} | {t.speedup:.2f}x | {t.warmup:.1f} | "
                     f"{'yes' if r['recipe'] else 'no'} ({r['recipe_steps']}) | {'yes' if r['long'] else 'no'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default=",".join(DEFAULT_PRESETS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", help="folder for the Markdown result")
    args = parser.parse_args()
    reuse_freed_memory()                    # as attncnn train does
    rows = []
    for preset in [p for p in args.presets.split(",") if p]:
        rows.append(measure(preset, args.reps))
        t = rows[-1]["timing"]
        print(f"{preset}: eager {1e3 * t.eager:.0f} ms, compiled {1e3 * t.compiled:.0f} ms, "
              f"{t.speedup:.2f}x, warm-up {t.warmup:.1f} s", flush=True)
    lines = table(rows, args.reps)
    print("\n".join(lines))
    if args.out:
        print(f"wrote {write_result(args.out, 'compile-choice', lines)}")


if __name__ == "__main__":
    main()
