"""Side by side: content attention's softmax writing bf16 (``half_softmax = True``, the default)
against float32 probabilities, one training step of a whole model under bf16 autocast.

    python benchmarks/half_softmax.py [--preset learned-content-mini] [--batch-size 100] [--rounds 3]

The two settings are measured in alternation (the order reversed every other round) and the
median of the rounds is printed with the ratio, so a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from attncnn.layers import ContentAttention
from attncnn.models import build_model


def step_seconds(model, x, y, opt, reps: int) -> float:
    """Best-of-``reps`` seconds of one SGD step (forward, backward, update) under bf16 autocast."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="learned-content-mini")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build_model(args.preset).train()
    layers = [m for m in model.modules() if isinstance(m, ContentAttention)]
    if not layers:
        raise SystemExit(f"{args.preset} has no content attention: half_softmax does not apply")
    x, y = torch.randn(args.batch_size, 3, 32, 32), torch.randint(0, 10, (args.batch_size,))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    step_seconds(model, x, y, opt, 1)                                  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for half in ((True, False) if r % 2 == 0 else (False, True)):
            for layer in layers:
                layer.half_softmax = half
            times[half].append(step_seconds(model, x, y, opt, args.reps))
    half, full = statistics.median(times[True]), statistics.median(times[False])
    print(f"{args.preset}, batch {args.batch_size}, {torch.get_num_threads()} threads, bf16 autocast, "
          f"median of {args.rounds} rounds (best of {args.reps} steps each):")
    print(f"  softmax -> float32 probabilities: {full:.3f} s/step")
    print(f"  softmax -> bf16 probabilities:    {half:.3f} s/step   ({full / half:.2f}x)")


if __name__ == "__main__":
    main()
