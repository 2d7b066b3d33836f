"""One row of ``benchmarks/gpu/mini_speed.py``, in a process of its own (its compilation and CUDA
graphs die with it): a mini preset's training step built one way, timed, and checked against the
eager step. ``mini_speed.py`` starts it; by hand (``PYTHONPATH=src``)::

    python benchmarks/gpu/mini_rows.py --preset quadratic-mini --row reduce-overhead --result row.json \\
        [--device cuda] [--batch-size 100] [--precision bf16] [--warmup 5] [--steps 50] [--layers N]

The network and optimizer are the trainer's (``build_model`` with the layers' own path, ``auto``;
``make_optimizer`` of the preset's recipe: SGD 0.1, momentum 0.9, weight decay 1e-4 with its two
groups), the batches random normal images of CIFAR's shape (3x32x32) and random labels of 10
classes. Rows (:data:`ROWS`):

* ``eager``: today's step (:func:`attncnn.training.step.training_step` on the plain network);
* ``compile``: today's ``--compile``, ``torch.compile(net, dynamic=False)``;
* ``reduce-overhead``: the same in CUDA-graph mode, each step marked
  (``torch.compiler.cudagraph_mark_step_begin``), as ``--compile-mode reduce-overhead`` trains;
* ``reduce-overhead+fused``: that with the optimizer's fused kernel (``--fused-optimizer``);
* ``whole-step``: forward, loss, backward and the optimizer's step in one
  ``torch.compile(mode="reduce-overhead")`` function, the gradients cleared before it, the learning
  rate held in each param group as a 0-dim tensor on the device and written in place each step, so
  that a new value does not recompile (torch's documented way for a compiled optimizer).
  ``Tensor.backward`` breaks dynamo's graph there: the row reports the graphs and breaks it saw.
* ``profile``: the eager step under ``torch.profiler`` (:func:`profile_eager`).

Off CUDA, inductor skips CUDA graphs and the ``reduce-overhead`` rows compile what ``compile`` does
(the row's note says so): a CPU run tries the script, it measures nothing of a GPU.

Timing: ``--warmup`` steps after the exactness steps below (compiled rows: their compilation and,
with CUDA graphs, their recording; ``warmup_s`` is all of them, the exactness steps' included), then
``--steps`` steps, the learning rate changed each step as the trainer's schedule does, the device
synchronised only before and after them. The row's dynamo counters (graphs compiled, graph breaks,
graphs inductor left out of CUDA graphs: a mutated input, say, which the row's note and log tell)
are read after the warm-up and after the timed steps: a timed step that recompiled shows as
``recompiled_in_timing`` above 0.

Exactness: from the same initial weights and the same 3 batches (learning rates 0.1, 0.095, 0.09),
the row's first 3 steps (the first one includes the compilation: ``first_step_s``) against the eager
step's in bf16, and against the eager step in fp32, which stands for the exact result (its own
rounding is 2**-16 times bf16's). The bound a row's difference is judged against: where ``E`` is the
eager bf16 step's distance from fp32 (measured) and ``R`` the row's, a row rounding no worse than
eager has ``R <= E`` (up to rounding's spread), so ``|row - eager| <= R + E <= 2 E``; a difference
within one bf16 unit (``2**-8``) of the quantity's scale is inside bf16's resolution whatever ``E``
is (``E`` can be small by cancellation). So the weights' bound is ``max(2 E_w, 2**-8 U)`` with ``U``
the largest change of a weight over the 3 steps (the float32 weights carry bf16's error only in
their updates), and the losses' ``max(2 E_l, 2**-8 L)`` with ``L`` the largest of the 3 losses.
Differences are of the largest element; ``param_scale`` is the largest weight. With ``--precision
fp32`` (a trial) the eager step is its own reference, ``E`` is 0 and only the bf16 unit is left: a
bound far too loose for fp32, whose differences show as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROWS = ("eager", "compile", "reduce-overhead", "reduce-overhead+fused", "whole-step", "profile")
EXACT_LRS = (0.1, 0.095, 0.09)
BF16_UNIT = 2.0 ** -8


def build(preset: str, device, fused: bool = False, layers: int | None = None):
    """``(model, optimizer)`` as the trainer builds them, seeded: the same weights in every row."""
    import torch

    from attncnn.models import build_model
    from attncnn.runs import resolve_config
    from attncnn.training.components import make_optimizer
    torch.manual_seed(0)
    model = build_model(preset, num_classes=10, **({"num_layers": layers} if layers else {})).to(device).train()
    return model, make_optimizer(model, resolve_config(preset), fused=fused)


def batches(n: int, batch: int, device, seed: int) -> list:
    """``n`` batches of random normal ``(batch, 3, 32, 32)`` images and labels below 10."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, 32, 32, generator=generator).to(device),
             torch.randint(0, 10, (batch,), generator=generator).to(device)) for _ in range(n)]


def make_step(row: str, model, optimizer, precision: str):
    """``step(images, labels, lr) -> loss`` for ``row`` (module docstring); the loss may live in a
    CUDA graph's memory, valid until the next step."""
    import torch

    from attncnn.layers.autocast_rules import autocast
    from attncnn.training.step import training_step
    if row == "whole-step":
        device = next(model.parameters()).device
        for group in optimizer.param_groups:
            group["lr"] = torch.tensor(float(group["lr"]), device=device)

        @torch.compile(mode="reduce-overhead", dynamic=False)
        def whole(images, labels):
            with autocast(precision, images.device):
                logits = model(images)
            loss = torch.nn.functional.cross_entropy(logits.float(), labels)
            loss.backward()
            optimizer.step()
            return loss.detach()

        def step(images, labels, lr):
            for group in optimizer.param_groups:
                group["lr"].fill_(lr)
            torch.compiler.cudagraph_mark_step_begin()
            optimizer.zero_grad(set_to_none=True)           # outside: dynamo does not trace zero_grad
            return whole(images, labels)
        return step
    graphs = row.startswith("reduce-overhead")
    net = model if row in ("eager", "profile") else torch.compile(
        model, dynamic=False, mode="reduce-overhead" if graphs else "default")

    def step(images, labels, lr):
        for group in optimizer.param_groups:
            group["lr"] = lr
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return training_step(net, optimizer, images, labels, precision)[0].detach()
    return step


def machine(device) -> dict:
    """The row's torch and device: the GPU's name and CUDA version, or the CPU's model and cores."""
    import torch
    info = {"torch": torch.__version__}
    if device.type == "cuda":
        return {**info, "gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda}
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return {**info, "cpu": f"{names[0]}, {len(names)} cores" if names else "unknown CPU"}


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _counters() -> dict:
    from torch._dynamo.utils import counters
    return {"graphs": counters["stats"]["unique_graphs"], "breaks": sum(counters["graph_break"].values()),
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}


def three_steps(step, exact: list) -> tuple[list[float], float, float]:
    """The losses of 3 steps on ``exact`` at :data:`EXACT_LRS`, the first step's seconds and all three's."""
    losses, seconds = [], []
    for (images, labels), lr in zip(exact, EXACT_LRS):
        started = time.perf_counter()
        losses.append(float(step(images, labels, lr)))       # read now: the next step may overwrite it
        seconds.append(time.perf_counter() - started)
    return losses, seconds[0], sum(seconds)


def reference(preset: str, device, precision: str, exact: list, layers: int | None) -> tuple[list, list]:
    """``(weights, losses)`` after the eager step's 3 exactness steps at ``precision``."""
    model, optimizer = build(preset, device, layers=layers)
    losses, _, _ = three_steps(make_step("eager", model, optimizer, precision), exact)
    return [p.detach().double() for p in model.parameters()], losses


def judged(weights: list, losses: list, eager: tuple, fp32: tuple, start: list) -> dict:
    """The row's exactness against the eager bf16 step, with its bound (module docstring)."""
    def largest(a, b):
        return max((x.double() - y).abs().max().item() for x, y in zip(a, b))

    update = largest(eager[0], start)
    weight_bound = max(2 * largest(eager[0], fp32[0]), BF16_UNIT * update)
    loss_bound = max(2 * max(abs(a - b) for a, b in zip(eager[1], fp32[1])), BF16_UNIT * max(map(abs, eager[1])))
    out = {"param_diff": largest(weights, eager[0]), "param_scale": max(p.abs().max().item() for p in eager[0]),
           "param_bound": weight_bound, "param_update": update,
           "loss_diff": max(abs(a - b) for a, b in zip(losses, eager[1])), "loss_bound": loss_bound,
           "losses": losses, "eager_losses": eager[1], "fp32_losses": fp32[1]}
    out["exact"] = out["param_diff"] <= weight_bound and out["loss_diff"] <= loss_bound
    return out


def run_row(args: argparse.Namespace) -> dict:
    """One row's measurements (module docstring)."""
    import torch
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model, optimizer = build(args.preset, device, fused=args.row.endswith("+fused"), layers=args.layers)
    start = [p.detach().double().clone() for p in model.parameters()]
    paths = model.attention_paths(32, 32) if hasattr(model, "attention_paths") else []
    exact = batches(3, args.batch_size, device, seed=1)
    step = make_step(args.row, model, optimizer, args.precision)
    losses, first, exact_s = three_steps(step, exact)
    weights = [p.detach().double().clone() for p in model.parameters()]
    eager = reference(args.preset, device, args.precision, exact, args.layers)
    fp32 = reference(args.preset, device, "fp32", exact, args.layers)
    train = batches(3, args.batch_size, device, seed=2)
    _sync(device)
    started = time.perf_counter()
    for i in range(args.warmup):
        step(*train[i % 3], 0.1 * (1 - i / (args.warmup + args.steps)))
    _sync(device)
    warmup = time.perf_counter() - started + exact_s         # the exactness steps warm up too
    warmed = _counters()
    started = time.perf_counter()
    for i in range(args.steps):
        step(*train[i % 3], 0.1 * (1 - (args.warmup + i) / (args.warmup + args.steps)))
    _sync(device)
    timed = time.perf_counter() - started
    after = _counters()
    graphed = args.row not in ("eager", "compile")
    note = "cudagraphs skipped off CUDA" if device.type != "cuda" and graphed else (
        f"{after['cudagraph_skips']} graph(s) not CUDA-graphed: the log in the json says why"
        if graphed and after["cudagraph_skips"] else "")
    return {"preset": args.preset, "row": args.row, "paths": paths, "device": str(device),
            "images_per_s": args.batch_size * args.steps / timed, "step_ms": 1e3 * timed / args.steps,
            "first_step_s": first, "warmup_s": warmup, "graphs": after["graphs"], "graph_breaks": after["breaks"],
            "recompiled_in_timing": after["graphs"] - warmed["graphs"], "cudagraph_skips": after["cudagraph_skips"],
            "note": note,
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            **judged(weights, losses, eager, fp32, start)}


def profile_eager(args: argparse.Namespace, top: int = 15, steps: int = 10) -> dict:
    """The eager step under ``torch.profiler``: unprofiled wall seconds per step, the device's
    kernel seconds per step (CUDA: kernels, copies and sets) and their share of the wall time (the
    rest: the GPU idle, waiting for launches), kernel launches per step, and the ``top`` kernels by
    time. On a CPU: the operators' self CPU time instead of kernels (a trial of the script)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    device = torch.device(args.device)
    model, optimizer = build(args.preset, device, layers=args.layers)
    step = make_step("eager", model, optimizer, args.precision)
    train = batches(3, args.batch_size, device, seed=2)
    for i in range(max(args.warmup, 2)):
        step(*train[i % 3], 0.1)
    _sync(device)
    started = time.perf_counter()
    for i in range(steps):
        step(*train[i % 3], 0.1)
    _sync(device)
    wall = (time.perf_counter() - started) / steps
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for i in range(steps):
            step(*train[i % 3], 0.1)
        _sync(device)
    rows = []
    for event in prof.key_averages():
        on_device = event.device_type == torch.autograd.DeviceType.CUDA
        if cuda != on_device:
            continue
        seconds = (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e6
        if seconds > 0:
            rows.append((event.key, event.count / steps, seconds / steps))
    rows.sort(key=lambda r: -r[2])
    busy = sum(r[2] for r in rows)
    launches = sum(event.count for event in prof.key_averages() if "cudaLaunchKernel" in event.key
                   or "cuLaunchKernel" in event.key) / steps
    return {"preset": args.preset, "row": "profile", "device": str(device), "wall_ms": 1e3 * wall,
            "busy_ms": 1e3 * busy, "idle_share": max(0.0, 1 - busy / wall) if cuda else None,
            "launches_per_step": launches if cuda else None, "calls_per_step": sum(r[1] for r in rows),
            "what": "GPU kernels" if cuda else "CPU operators (self time)",
            "top": [{"name": name, "calls": calls, "ms": 1e3 * s, "share": s / busy} for name, calls, s in rows[:top]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--row", choices=ROWS, required=True)
    parser.add_argument("--result", required=True, help="file of the row's JSON result")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--layers", type=int, help="the presets with this many layers (a quick trial)")
    args = parser.parse_args(argv)
    import torch
    result = profile_eager(args) if args.row == "profile" else run_row(args)
    result["machine"] = machine(torch.device(args.device))
    Path(args.result).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    # the lent machine has torch but not attncnn installed: the checkout's src/, as tools/gpu_job.py does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    sys.exit(main())
