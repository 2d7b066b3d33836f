"""Where a preset's training step and test pass spend their time, and how fast they could be.

    python benchmarks/profile_step.py [--presets quadratic-mini,learned-mini,...] [--batch-size 100]
                                      [--precision bf16] [--steps 2] [--impl rule] [--out results/NAME.md]
                                      [--device cpu|cuda] [--compile]

For each preset (built as ``attncnn train`` builds it: the attention path the written rule gives
on this machine unless ``--impl`` names one, freed host memory kept for reuse), on random images:

1. FLOPs of the formulation actually run (``FlopCounterMode``, separable path where the layer takes
   it), forward and forward + backward, per image of a ``--batch-size`` step (per-step products, such
   as the bilinear path's folded map, shared by the batch: ``harness.flops_per_image``).
2. Wall time: median of ``--steps + 1`` training steps (forward, loss, backward, SGD momentum 0.9) and
   of as many test-mode forwards, after two warm-up calls, without the profiler.
3. A ``torch.profiler`` trace of ``--steps`` more of each, whose operators' self CPU times are summed
   into groups: matrix products (mm, addmm, bmm, baddbmm, convolutions, SDPA kernels), copies and
   casts, softmax, normalisation, activations, dropout, optimiser, everything else. On a GPU
   (``--device cuda``) the groups sum the GPU kernels' own times instead, each kernel placed by its
   name (:func:`kernel_group`: cuBLAS/CUTLASS/cuDNN products and attention kernels, softmax, ...,
   and the kernels ``torch.compile`` generated, ``triton_*``, in a group of their own).

``--compile`` times and profiles the ``torch.compile``d step (its compilation is in the warm-up
calls, outside the timing); the FLOPs are counted on the eager model, which computes the same.

and prints, next to the machine's measured bf16 (or fp32) matrix-product peak (2048^2):

- ``GF/s as run``: FLOPs as run / wall time; ``% peak`` its share of the measured peak.
- ``products at``: FLOPs / the time the matrix products themselves took, as a share of the peak
  (how well the products run).
- ``ceiling: no overhead``: wall / product time, the speed-up if everything but the products cost
  nothing; ``ceiling: peak``: wall / (FLOPs / peak), the speed-up if the products also ran at the
  measured peak. A goal above ``ceiling: peak`` needs fewer FLOPs, not a better kernel.

The profiler adds a little time per operator; the group shares are of the profiled time (on a
GPU: of the kernels' time, so idle gaps between kernels, launch overhead, count in ``ceiling: no
overhead`` but in no group), the ceilings use the unprofiled wall time and the products' share.
Measure on an idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import platform
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from attncnn.models import build_model, preset_model_config
from attncnn.perf.bench.harness import flops_per_image, matmul_peak, step_functions, time_median
from attncnn.perf.host_memory import reuse_freed_memory
from attncnn.perf.rule import choose, device_kind

MINIS = ("quadratic-mini", "learned-mini", "quadratic-generalized-mini", "gpsa-mini", "learned-content-mini",
         "resnet18-mini")

# operator name (without "aten::") -> group; names not listed fall in "other"
GROUPS = {
    "products": ("mm", "addmm", "bmm", "baddbmm", "addbmm", "mkldnn_convolution", "convolution_backward",
                 "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_flash_attention_for_cpu_backward", "_mkldnn_convolution",
                 "mkldnn_rnn_layer", "_convolution", "convolution", "conv2d"),
    "copies and casts": ("copy_", "_to_copy", "clone", "contiguous", "cat", "stack", "index_select",
                         "_unsafe_view", "reshape", "expand", "permute", "transpose", "as_strided",
                         "empty", "empty_strided", "zeros", "zero_", "fill_", "new_zeros", "empty_like"),
    "softmax": ("_softmax", "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data"),
    "normalisation": ("native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
                      "native_batch_norm_backward", "_batch_norm_impl_index", "_native_batch_norm_legit",
                      "_native_batch_norm_legit_no_training", "_batch_norm_with_update",
                      "batch_norm_backward"),
    "activations": ("gelu", "gelu_backward", "relu", "relu_", "threshold_backward", "sigmoid",
                    "sigmoid_backward", "clamp_min", "clamp_min_"),
    "dropout": ("native_dropout", "native_dropout_backward", "bernoulli_"),
    "optimiser": ("_foreach_add_", "_foreach_mul_", "_foreach_add", "_foreach_addcmul_", "_foreach_lerp_",
                  "_foreach_mul", "_foreach_sqrt", "_foreach_div_", "_foreach_addcdiv_"),
}
GROUP_OF = {name: group for group, names in GROUPS.items() for name in names}

# GPU kernels: a group and the (lower-case) parts of a kernel's name that place it there, tried in
# this order (a compiled matrix-product template, triton_tem_*, is a product; other triton_* kernels
# are what torch.compile fused); names with none of them fall in "other"
KERNEL_GROUPS = (
    ("products", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "cudnn", "flash", "fmha", "attention",
                  "triton_tem", "convolution", "conv2d", "fprop", "wgrad", "dgrad")),
    ("softmax", ("softmax",)),
    ("normalisation", ("layer_norm", "layernorm", "batch_norm", "batchnorm")),
    ("dropout", ("dropout", "bernoulli")),
    ("optimiser", ("multi_tensor_apply", "foreach")),
    ("fused (compiled)", ("triton_",)),
    ("copies and casts", ("memcpy", "memset", "copy", "cast", "transpose", "cat_", "index")),
    ("activations", ("gelu", "relu", "threshold", "sigmoid")),
)


def kernel_group(name: str) -> str:
    """The group of a GPU kernel, from its name (see ``KERNEL_GROUPS``)."""
    lower = name.lower()
    for group, parts in KERNEL_GROUPS:
        if any(part in lower for part in parts):
            return group
    return "other"


def _group_times(prof, device: torch.device) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Seconds per group and per operator: self CPU times of the operators, or on a GPU the
    kernels' own times (top level of the profile's key averages)."""
    groups: dict[str, float] = defaultdict(float)
    ops = []
    for event in prof.key_averages():
        if device.type == "cuda":
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            seconds, group = event.self_device_time_total / 1e6, kernel_group(event.key)
        elif event.key.startswith("## Call CompiledFxGraph"):     # the code torch.compile generated, run
            seconds, group = event.self_cpu_time_total / 1e6, "fused (compiled)"
        else:
            seconds, group = event.self_cpu_time_total / 1e6, GROUP_OF.get(event.key.removeprefix("aten::"), "other")
        if seconds <= 0:
            continue
        groups[group] += seconds
        ops.append((event.key, seconds))
    ops.sort(key=lambda item: -item[1])
    return dict(groups), ops


def _path(preset: str, impl: str, batch_size: int, precision: str, device: torch.device) -> str | None:
    """The attention path to build ``preset`` with: ``impl``, or for ``"rule"`` what
    ``attncnn train`` would take here by default (the written rule, :func:`attncnn.perf.rule.choose`;
    None: the preset has no attention layers)."""
    arch, config = preset_model_config(preset, 10)
    if not hasattr(config, "attention"):
        return None
    if impl != "rule":
        return impl
    grid = (32 // config.pooling, 32 // config.pooling)
    return choose(device_kind(device), config.attention, grid, precision, 0, batch=batch_size).train_impl


def profile_preset(preset: str, batch_size: int, precision: str, steps: int, impl: str = "auto",
                   device: str = "cpu", compile: bool = False, num_classes: int = 10,
                   model_options: dict | None = None) -> dict:
    """One preset's training step and test pass: FLOPs, unprofiled wall time, profiled groups (see
    the module docstring). ``compile``: time and profile ``torch.compile(model)``; ``num_classes``
    and ``model_options`` (e.g. ``{"dim": 16}``) change the preset's model."""
    dev = torch.device(device)
    path = _path(preset, impl, batch_size, precision, dev)
    torch.manual_seed(0)
    options = dict(model_options or {}, **({} if path is None else {"impl": path}))
    model = build_model(preset, num_classes, **options).to(dev)
    images = torch.randn(batch_size, 3, 32, 32).to(dev)
    labels = torch.randint(0, num_classes, (batch_size,)).to(dev)
    fwd_flops, train_flops = flops_per_image(model, images, labels, batch_size, dense=False)
    run_model = torch.compile(model, dynamic=False) if compile else None     # as attncnn train compiles
    train_step, test_pass = step_functions(model, images, labels, run_model=run_model, precision=precision)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])

    result = {"preset": preset, "path": path or "-", "compiled": compile}
    for mode, fn, flops in (("train", train_step, train_flops), ("test", test_pass, fwd_flops)):
        model.train(mode == "train")
        wall = time_median(fn, dev, warmup=2, reps=steps + 1)           # the warm-up compiles, if asked
        with profile(activities=activities) as prof:
            for _ in range(steps):
                fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        groups, ops = _group_times(prof, dev)
        total = sum(groups.values())
        result[mode] = {"wall_seconds": wall, "images_per_s": batch_size / wall,
                        "flops_per_image": flops, "flops_per_s": flops * batch_size / wall,
                        "shares": {g: s / total for g, s in groups.items()},
                        "product_seconds": groups.get("products", 0.0) / steps,
                        "busy_seconds": total / steps,      # on a GPU: kernel time per call (wall - idle gaps)
                        "top_ops": [(name, s / total) for name, s in ops[:6]]}
    return result


def _markdown(results: list[dict], peak: float, args, machine: str) -> str:
    gpu = args.device.startswith("cuda")
    size = 8192 if gpu else 2048
    lines = [f"# Step profile: {machine}, torch {torch.__version__}, {datetime.date.today().isoformat()}", "",
             f"`python benchmarks/profile_step.py --precision {args.precision} --batch-size {args.batch_size} "
             f"--steps {args.steps} --impl {args.impl} --device {args.device}{' --compile' if args.compile else ''}`; "
             f"measured {args.precision} matrix-product peak ({size}^2): {peak / 1e9:.0f} GFLOP/s. Wall times "
             "unprofiled (median), shares from the profiler's "
             + ("GPU kernel times." if gpu else "self CPU times."), ""]
    groups = ([g for g, _ in KERNEL_GROUPS] if gpu else list(GROUPS) + ["fused (compiled)"]) + ["other"]
    for mode in ("train", "test"):
        lines += [f"## {'Training step' if mode == 'train' else 'Test pass'} (batch {args.batch_size})", "",
                  "| preset | path | s | img/s | GFLOP/img as run | GF/s as run | % peak | products at (% peak) "
                  "| ceiling: no overhead | ceiling: peak | " + ("GPU busy % | " if gpu else "")
                  + " | ".join(groups) + " |",
                  "|---|---|" + "---:|" * (9 + gpu + len(groups))]
        for r in results:
            m = r[mode]
            products = m["shares"].get("products", 0.0)
            # CPU: the products' share of the profiled time, applied to the unprofiled wall time; GPU:
            # the product kernels' own seconds (the profiler barely slows kernels; idle gaps are in no group)
            product_seconds = m["product_seconds"] if gpu else products * m["wall_seconds"]
            flops_step = m["flops_per_image"] * args.batch_size
            at = flops_step / product_seconds / peak if product_seconds else float("nan")
            busy = f"{100 * m['busy_seconds'] / m['wall_seconds']:.0f} | " if gpu else ""
            lines.append(
                f"| `{r['preset']}` | {r['path']} | {m['wall_seconds']:.3f} | {m['images_per_s']:.0f} | "
                f"{m['flops_per_image'] / 1e9:.3f} | {m['flops_per_s'] / 1e9:.0f} | "
                f"{100 * m['flops_per_s'] / peak:.0f} | {100 * at:.0f} | "
                f"{m['wall_seconds'] / product_seconds if product_seconds else float('nan'):.2f}x | "
                f"{m['wall_seconds'] * peak / flops_step:.2f}x | " + busy
                + " | ".join(f"{100 * m['shares'].get(g, 0.0):.0f}" for g in groups) + " |")
        lines += ["", "Largest operators (self time share):", ""]
        for r in results:
            tops = ", ".join(f"`{name}` {100 * share:.0f} %" for name, share in r[mode]["top_ops"])
            lines.append(f"- `{r['preset']}`: {tops}")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default=",".join(MINIS))
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--impl", default="rule",
                        help="attention path: 'rule' (what attncnn train takes on this machine, the default), "
                             "'auto' (the layers' own rule) or a path name (dense, folded, separable, ...)")
    parser.add_argument("--out", default=None, help="also write the Markdown table to this file")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--compile", action="store_true", help="profile the torch.compile'd step")
    args = parser.parse_args()
    reuse_freed_memory()                                 # as attncnn train does
    device = torch.device(args.device)
    peak = matmul_peak(device, torch.bfloat16 if args.precision == "bf16" else torch.float32)
    machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        machine = f"{names[0]}, {len(names)} cores" if names else machine
    except OSError:
        pass
    if device.type == "cuda":
        machine = f"{torch.cuda.get_device_name(device)} (host: {machine})"
    results = []
    for preset in args.presets.split(","):
        results.append(profile_preset(preset, args.batch_size, args.precision, args.steps, args.impl,
                                      device=args.device, compile=args.compile))
        print(f"profiled {preset}", flush=True)
    text = _markdown(results, peak, args, machine)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
