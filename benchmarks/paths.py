"""Side by side: the computation paths (``impl``) of a preset's attention layers, alternated.

    python benchmarks/paths.py [--preset quadratic-mini] [--impls dense,separable] [--layers 1]
                               [--batch-size 100] [--precision bf16] [--rounds 5] [--grid 16]

Builds one model per ``impl`` with the same weights (``attncnn.build_model(preset, impl=...)``),
checks that their outputs agree, then times the forward pass (eval mode) and one SGD training
step (forward, backward, update) of each, alternating the order every round so that a busy
machine slows all alike; prints the median per impl and its ratio to the first impl. With
``--layers N`` only the first N blocks are kept (the blocks of a preset are identical, so the
ratio holds for all of them). ``--grid`` sets the token grid side (images of ``grid * pooling``).

What it has measured (the docstrings of the layers name it for: the separable threshold
``H W >= 6 (H + W)``, GPSA's fused path, content attention's ``explicit-half`` softmax) is kept
in ``benchmarks/results/attention-paths.md``, with the machine of each number.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from attncnn.models import build_model
from attncnn.perf.host_memory import reuse_freed_memory


def _autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def _forward_seconds(model, x, precision: str, reps: int) -> float:
    model.eval()
    best = float("inf")
    with torch.no_grad():
        for _ in range(reps):
            start = time.perf_counter()
            with _autocast(precision):
                model(x)
            best = min(best, time.perf_counter() - start)
    return best


def _step_seconds(model, x, y, precision: str, reps: int) -> float:
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)      # lr 0: the weights stay equal across impls
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        with _autocast(precision):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        best = min(best, time.perf_counter() - start)
    return best


def _models(args, impls: list[str]):
    models = {}
    for impl in impls:
        torch.manual_seed(0)
        model = build_model(args.preset, impl=impl)
        if args.layers:
            del model.blocks[args.layers:]
        models[impl] = model
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="quadratic-mini")
    parser.add_argument("--impls", default=None, help="comma-separated (default: every path of the preset's layers)")
    parser.add_argument("--layers", type=int, default=0, help="keep the first N blocks (0: all)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--grid", type=int, default=None, help="token grid side (default: 32x32 images)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=2, help="steps per round and impl (best is kept)")
    args = parser.parse_args()
    reuse_freed_memory()        # the heap policy of attncnn train: no page faults on the scores' pages
    probe = build_model(args.preset)
    layer = probe.blocks[0].attention
    # by default the paths that train on the CPU (a CUDA kernel's path is measured by benchmarks/gpu/speed.py)
    impls = args.impls.split(",") if args.impls else [
        i for i in layer.impls if i != "auto" and layer.path_unavailable(i, torch.device("cpu"), backward=True) is None]
    models = _models(args, impls)
    side = (args.grid or 32 // probe.config.pooling) * probe.config.pooling
    x, y = torch.randn(args.batch_size, 3, side, side), torch.randint(0, 10, (args.batch_size,))
    with torch.no_grad(), _autocast(args.precision):
        outs = {impl: m.eval()(x).float() for impl, m in models.items()}
    first = outs[impls[0]]
    for impl, out in outs.items():
        err = float((out - first).abs().max() / first.abs().max())
        print(f"  {impl}: max |output - {impls[0]}| / max |{impls[0]}| = {err:.2e}")
    for m in models.values():                                  # warm-up
        _forward_seconds(m, x, args.precision, 1)
        _step_seconds(m, x, y, args.precision, 1)
    times = {impl: {"forward": [], "step": []} for impl in impls}
    for r in range(args.rounds):
        for impl in (impls if r % 2 == 0 else impls[::-1]):
            times[impl]["forward"].append(_forward_seconds(models[impl], x, args.precision, args.reps))
            times[impl]["step"].append(_step_seconds(models[impl], x, y, args.precision, args.reps))
    print(f"{args.preset} ({args.layers or len(probe.blocks)} blocks), batch {args.batch_size}, "
          f"{side}x{side} images, {args.precision}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}; median of {args.rounds} alternated rounds:")
    base = {k: statistics.median(v) for k, v in times[impls[0]].items()}
    for impl in impls:
        med = {k: statistics.median(v) for k, v in times[impl].items()}
        print(f"  {impl:>14}: forward {1e3 * med['forward']:8.1f} ms ({base['forward'] / med['forward']:.2f}x)"
              f"   training step {1e3 * med['step']:8.1f} ms ({base['step'] / med['step']:.2f}x)")


if __name__ == "__main__":
    main()
