"""How many operator calls one eager training step of a preset makes: the work a launch-bound GPU
step pays per call, counted on any device.

    python benchmarks/dispatch_count.py [--presets quadratic-mini,learned-mini] [--batch-size 100]
                                        [--layers N] [--out results/NAME.md]

A small model's eager step on a GPU is set by the host, not the GPU: every ATen operator call goes
through Python and the dispatcher, and each call that computes launches at least one kernel.
For the same attention path and precision the count does not depend on the device (the same
autograd graph, the same operators), so a CPU tells a GPU session what it will pay per step before
it has one (a GPU may choose another path, and bf16 autocast adds casts: the step here is fp32, each
layer on the path its own rule gives). For each preset (built as
``benchmarks/gpu/mini_rows.py`` builds it: the trainer's network and optimizer), after two warm-up
steps, ``torch.profiler`` records:

* forward + loss + backward: every ATen call (``aten calls``), those not called from inside another
  ATen operator (``top-level``: the calls the Python code and the autograd engine make), and the
  innermost calls that compute (``computing leaves``: views, reshapes, allocations and dtype queries
  left out; on a GPU, roughly its kernel launches);
* the optimizer's step, top-level calls, with the ``foreach`` kernels (CUDA's default; forced here,
  the CPU's default is a loop over the tensors) and with the ``fused`` one (``--fused-optimizer``).

Also the per-step work of the training loop around the step: one training batch of the loader
(index, random crop and flip, normalisation) and the running sums. Nothing is timed.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from mini_rows import batches, build  # noqa: E402  (the rows' own builder: the same model and optimizer)

#: ATen calls that compute nothing: views, reshapes, allocations, dtype queries and casts' wrappers
#: (the copy a cast makes is its own ``aten::copy_`` leaf)
NOT_COMPUTING = frozenset(f"aten::{name}" for name in (
    "view", "as_strided", "reshape", "_reshape_alias", "expand", "transpose", "t", "permute", "unsqueeze",
    "squeeze", "select", "slice", "detach", "alias", "empty", "empty_strided", "unbind", "split", "chunk",
    "narrow", "resolve_conj", "resolve_neg", "lift_fresh", "_unsafe_view", "view_as", "empty_like",
    "split_with_sizes", "movedim", "contiguous", "result_type", "to", "_to_copy"))


def count_calls(fn: Callable[[], object]) -> dict:
    """Run ``fn`` once under the profiler: ``{"calls", "top_level", "computing"}`` of its ATen calls
    (module docstring)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    aten = [e for e in prof.events() if e.name.startswith("aten::")]
    callers = {e.id for e in aten for c in e.cpu_children if c.name.startswith("aten::")}
    called = {c.id for e in aten for c in e.cpu_children if c.name.startswith("aten::")}
    leaves = [e for e in aten if e.id not in callers]
    return {"calls": len(aten), "top_level": sum(e.id not in called for e in aten),
            "computing": sum(e.name not in NOT_COMPUTING for e in leaves)}


def step_counts(preset: str, batch_size: int, layers: int | None = None) -> dict:
    """The counts of one preset: ``forward_backward`` (:func:`count_calls`), ``foreach`` and
    ``fused`` (the optimizer step's top-level calls), ``param_groups``, ``parameters`` (tensors)."""
    out = {}
    for kernel in ("foreach", "fused"):
        model, optimizer = build(preset, "cpu", fused=kernel == "fused", layers=layers)
        if kernel == "foreach":
            for group in optimizer.param_groups:
                group["foreach"] = True
        (images, labels), = batches(1, batch_size, "cpu", 0)

        def backward():
            F.cross_entropy(model(images).float(), labels).backward()
        for _ in range(2):                                    # warm-up: lazy state, the momentum buffers
            optimizer.zero_grad(set_to_none=True)
            backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out["forward_backward"] = count_calls(backward)
        out[kernel] = count_calls(optimizer.step)["top_level"]
        out["param_groups"] = len(optimizer.param_groups)
        out["parameters"] = sum(1 for _ in model.parameters())
    return out


def loop_counts(batch_size: int) -> dict:
    """The training loop's own calls per step: one augmented training batch, the running sums."""
    from attncnn.data.base import ImageSplit
    from attncnn.data.loader import DeviceLoader
    from attncnn.training.state import RunningSums

    generator = torch.Generator().manual_seed(0)
    split = ImageSplit(torch.randint(0, 256, (4 * batch_size, 3, 32, 32), dtype=torch.uint8, generator=generator),
                       torch.randint(0, 10, (4 * batch_size,), generator=generator))
    batches_of = iter(DeviceLoader(split, batch_size=batch_size, train=True).batches(0))
    next(batches_of)
    sums = RunningSums(torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.long), 0,
                       torch.tensor(-1), torch.tensor(0.0))
    loss, logits = torch.tensor(2.3), torch.randn(batch_size, 10, generator=generator)
    labels = torch.randint(0, 10, (batch_size,), generator=generator)
    return {"batch": count_calls(lambda: next(batches_of)),
            "sums": count_calls(lambda: sums.add(1, loss, logits, labels))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="quadratic-mini,learned-mini")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--layers", type=int, default=None, help="build the presets with this many layers")
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    lines = [f"# Operator calls per eager training step ({datetime.date.today()}, torch {torch.__version__})", "",
             f"`benchmarks/dispatch_count.py --presets {args.presets} --batch-size {args.batch_size}"
             + (f" --layers {args.layers}" if args.layers else "") + "`; counted on the CPU, the same calls on "
             "any device for the same path and precision (fp32 here; module docstring).", "",
             "| preset | parameter tensors | forward + backward: aten calls | top-level | computing leaves | "
             "optimizer step, foreach: top-level | fused: top-level | param groups |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for preset in args.presets.split(","):
        c = step_counts(preset, args.batch_size, args.layers)
        fb = c["forward_backward"]
        lines.append(f"| `{preset}` | {c['parameters']} | {fb['calls']:,} | {fb['top_level']:,} | "
                     f"{fb['computing']:,} | {c['foreach']} | {c['fused']} | {c['param_groups']} |")
    loop = loop_counts(args.batch_size)
    lines += ["", "The loop around the step: " + "; ".join(
        f"{name} {v['calls']} aten calls ({v['top_level']} top-level, {v['computing']} computing leaves)"
        for name, v in (("one training batch", loop["batch"]), ("the running sums", loop["sums"])))]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
