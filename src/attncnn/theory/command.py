"""``attncnn theorem``: build the attention layer of Theorem 1 and check it against the convolution.

Runs both on real images (CIFAR-10 test images by default) and prints the max absolute and relative
errors (interior, border, all), the Lemma 2 bound for the alpha used, and timings. With ``--model``
(a preset such as ``quadratic-conv-mini``, or a checkpoint) it checks one layer of that network
instead: the convolution closest to it, per head, and the output error on the layer's real input
(:mod:`attncnn.theory.model_layer`).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from ..errors import InputError, MissingFileError
from ..runs.config import TrainConfig
from ..runs.options import key_value

__all__ = ["register", "run", "DTYPES"]

#: ``--dtype`` choices.
DTYPES = ("float64", "float32")


def register(subparsers) -> None:
    """Add the ``theorem`` sub-command to an :mod:`argparse` sub-parser set."""
    p = subparsers.add_parser(
        "theorem", help="build the self-attention layer equal to a convolution and measure the difference",
        description="Theorem 1 of Cordonnier et al. (2020) as code: a K*K-head quadratic self-attention layer "
                    "built to equal a KxK convolution, run against torch.nn.functional.conv2d on real images.")
    p.add_argument("--kernel", type=int, help="odd kernel size K (default 3; with --conv-from: the checkpoint's)")
    p.add_argument("--dilation", type=int, help="dilation (default 1)")
    p.add_argument("--stride", type=int, help="stride (default 1)")
    p.add_argument("--padding", choices=["same", "valid"], help="zero padding (K//2)*dilation or none "
                   "(default same; with --conv-from: the checkpoint's)")
    p.add_argument("--in-channels", type=int, help="input channels (default 3; image channels are repeated "
                   "cyclically to fill more)")
    p.add_argument("--out-channels", type=int, help="output channels of the random kernel (default 16)")
    p.add_argument("--alpha", type=float, help="sharpness of every head (default: exactly one-hot in --dtype, "
                   "87.3 for float32, 708.4 for float64)")
    p.add_argument("--dtype", choices=DTYPES, help="float64 (default) or float32 (default with --model)")
    p.add_argument("--images", type=int, default=100, help="number of test images (default 100)")
    p.add_argument("--data", help=f"data set of the test images: {TrainConfig.data} (default, as for train), "
                                  "cifar100, or a folder/zip as for train")
    p.add_argument("--data-dir",
                   help="cache folder for official archives (default: $ATTNCNN_DATA_DIR or ~/.cache/attncnn)")
    p.add_argument("--conv-from", metavar="CHECKPOINT",
                   help="use the first convolution (model.conv1) of a trained checkpoint, e.g. a ResNet18")
    p.add_argument("--model", metavar="PRESET_OR_RUN",
                   help="check a layer of this network instead of building one: a preset (built at step 0, e.g. "
                        "quadratic-conv-mini) or a checkpoint / run folder")
    p.add_argument("--set", dest="overrides", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="with a --model preset: change its configuration, e.g. locality_strength=87.4")
    p.add_argument("--layer", type=int, default=1, help="with --model: the block to check (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random kernel (with a --model preset: of its "
                                                        "initialisation)")
    p.add_argument("--repeats", type=int, default=3, help="timing repetitions; the best is reported (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def _kernel(args: argparse.Namespace, dtype):
    """(weight, bias, stride, dilation, padding, description) from the options or a checkpoint."""
    import torch
    from torch import nn

    if args.conv_from:
        from ..runs import load_model
        from .construct import _conv_parts

        model, _ = load_model(args.conv_from)
        conv = getattr(model, "conv1", None)
        name = "model.conv1"
        if not isinstance(conv, nn.Conv2d):
            named = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
            if not named:
                raise InputError(f"checkpoint {args.conv_from} holds no Conv2d layer")
            name, conv = named[0]
        # Validates the layer (odd square kernel, groups 1, zero padding) and reads its geometry.
        weight, bias, stride, dilation, padding = _conv_parts(conv, None, None, None, None, 2, nn.Conv2d)
        given = {"kernel": (args.kernel, weight.shape[-1]), "in-channels": (args.in_channels, weight.shape[1]),
                 "out-channels": (args.out_channels, weight.shape[0]), "dilation": (args.dilation, dilation)}
        for option, (value, actual) in given.items():
            if value is not None and value != actual:
                raise InputError(f"--{option} {value} contradicts the checkpoint's {name} ({actual}); leave it out")
        # --stride and --padding may change how the checkpoint's kernel is applied: the description says so
        changed = [f"{option} {new!r} instead of its {own!r}" for option, new, own in
                   (("stride", args.stride, stride), ("padding", args.padding, padding)) if new not in (None, own)]
        stride = args.stride if args.stride is not None else stride
        padding = args.padding or padding
        return (weight.to(dtype), None if bias is None else bias.to(dtype), stride, dilation, padding,
                f"checkpoint {args.conv_from} ({name}{', ' if changed else ''}{', '.join(changed)})")
    k = 3 if args.kernel is None else args.kernel
    c_in = 3 if args.in_channels is None else args.in_channels
    c_out = 16 if args.out_channels is None else args.out_channels
    if k < 1 or k % 2 == 0:
        raise InputError(f"--kernel must be odd and positive, got {k}")
    if c_in < 1 or c_out < 1:
        raise InputError(f"--in-channels and --out-channels must be positive, got {c_in}, {c_out}")
    gen = torch.Generator().manual_seed(args.seed)
    # PyTorch's default Conv2d scale: uniform in +-1/sqrt(fan_in), for weight and bias.
    bound = 1.0 / (c_in * k * k) ** 0.5
    weight = (torch.rand(c_out, c_in, k, k, generator=gen, dtype=torch.float64) * 2 - 1) * bound
    bias = (torch.rand(c_out, generator=gen, dtype=torch.float64) * 2 - 1) * bound
    return (weight.to(dtype), bias.to(dtype), 1 if args.stride is None else args.stride,
            1 if args.dilation is None else args.dilation, args.padding or "same", f"random (seed {args.seed})")


def _images(args: argparse.Namespace, c_in: int, dtype):
    """Normalised test images ``(N, C_in, H, W)`` and a description of their source."""
    import torch

    from ..data import CIFAR_MEAN, CIFAR_STD, load_dataset

    dataset = load_dataset(args.data or TrainConfig.data, data_dir=args.data_dir)
    raw = dataset.test.images[: args.images]
    x = torch.as_tensor(raw).to(torch.float64) / 255.0
    if x.shape[1] == 3:
        mean = torch.tensor(CIFAR_MEAN, dtype=torch.float64).view(1, 3, 1, 1)
        std = torch.tensor(CIFAR_STD, dtype=torch.float64).view(1, 3, 1, 1)
        x = (x - mean) / std
    if c_in != x.shape[1]:
        x = x[:, [c % x.shape[1] for c in range(c_in)]]
    return x.to(dtype), f"{x.shape[0]} test images {tuple(x.shape[2:])} of {dataset.source}"


def _best_time(fn, reps: int) -> tuple[object, float]:
    best, out = float("inf"), None
    for _ in range(reps):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2e}"


def run(args: argparse.Namespace) -> int:
    """Handler of ``attncnn theorem``; prints the result and returns the exit status (0).

    Raises:
        InputError: bad options (even kernel, contradicting a checkpoint, ...).
        attncnn.data.DataError, FileNotFoundError, OSError: the data or checkpoint cannot be read.
    """
    import torch
    import torch.nn.functional as F

    from .construct import attention_from_conv2d
    from .extract import interior_mask, output_errors
    from .lemma2 import lemma2_bound

    if args.images < 1 or args.repeats < 1:
        raise InputError(f"--images and --repeats must be positive, got {args.images}, {args.repeats}")
    if args.model:
        return _run_model(args)
    if args.overrides or args.layer != 1:
        raise InputError("--set and --layer apply to --model only; add --model PRESET (e.g. quadratic-conv-mini)")
    args.dtype = args.dtype or "float64"
    dtype = getattr(torch, args.dtype)
    weight, bias, stride, dilation, padding, kernel_source = _kernel(args, dtype)
    c_out, c_in, k, _ = weight.shape
    x, image_source = _images(args, c_in, dtype)
    pad = (k // 2) * dilation
    if padding == "valid" and min(x.shape[2:]) <= 2 * pad:
        raise InputError(f"'valid' padding needs images at least as large as the kernel extent {2 * pad + 1}")

    with torch.no_grad():
        start = time.perf_counter()
        module = attention_from_conv2d(weight, bias=bias, stride=stride, dilation=dilation, padding=padding,
                                       alpha=args.alpha)
        build_s = time.perf_counter() - start
        x_last = x.permute(0, 2, 3, 1).contiguous()
        ref, conv_s = _best_time(lambda: F.conv2d(x, weight, bias, stride, pad if padding == "same" else 0,
                                                  dilation).permute(0, 2, 3, 1), args.repeats)
        out, attn_s = _best_time(lambda: module(x_last), args.repeats)
        errors = output_errors(out, ref, interior_mask(tuple(x.shape[2:]), pad=pad, stride=stride, padding=padding))
        bound = lemma2_bound(module, x_last)

    alpha = float(module.alpha.detach()[0])
    scale = errors["max_abs_reference"]
    result = {
        "theorem": "Cordonnier et al. 2020, Theorem 1",
        "kernel_size": k, "dilation": dilation, "stride": stride, "padding": padding,
        "in_channels": c_in, "out_channels": c_out, "heads": k * k, "dtype": args.dtype,
        "alpha": alpha, "alpha_is_default": args.alpha is None, "kernel": kernel_source, "images": image_source,
        "input_shape": list(x_last.shape), "output_shape": list(out.shape),
        "max_abs_error": errors["max_abs"], "relative_error": errors["relative"], "max_abs_conv": scale,
        "lemma2": {"off_target_mass": bound.max_off_target_mass, "output_bound": bound.output_bound,
                   "relative_bound": bound.output_bound / scale if scale > 0 else None},
        "seconds": {"build": build_s, "conv": conv_s, "attention": attn_s},
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"Theorem 1: {k}x{k} convolution ({c_in} -> {c_out} channels, dilation {dilation}, stride {stride}, "
          f"{padding!r} padding) as {k * k}-head quadratic self-attention")
    print(f"kernel: {kernel_source}; inputs: {image_source}")
    print(f"dtype {args.dtype}, alpha {alpha:.2f}" + (" (default: exactly one-hot)" if args.alpha is None else ""))
    print()
    print("| region | max abs error | relative to max abs conv |")
    print("|---|---|---|")
    for region in ("interior", "border", "all"):
        print(f"| {region} | {_fmt(errors['max_abs'][region])} | {_fmt(errors['relative'][region])} |")
    print()
    rel = result["lemma2"]["relative_bound"]
    print(f"Lemma 2 (alpha {alpha:.2f}): off-target attention mass <= {bound.max_off_target_mass:.2e}, "
          f"max abs error <= {bound.output_bound:.2e} (relative {_fmt(rel)}; rounding not included)")
    print(f"timings: build {build_s * 1e3:.1f} ms, conv2d {conv_s * 1e3:.1f} ms, "
          f"attention {attn_s * 1e3:.1f} ms (best of {args.repeats}, {torch.get_num_threads()} threads)")
    return 0


def _model(args: argparse.Namespace):
    """``(model, description)`` for ``--model``: a preset built at step 0, or a checkpoint's network."""
    import torch

    from ..models import build_model, list_presets

    spec = args.model
    if spec in list_presets():
        torch.manual_seed(args.seed)
        overrides = dict(args.overrides)
        settings = "".join(f", {k}={v!r}" for k, v in overrides.items())
        return build_model(spec, **overrides), f"preset {spec} at step 0 (seed {args.seed}{settings})"
    if args.overrides:
        raise InputError(f"--set changes a preset, but {spec!r} is not one; a checkpoint keeps its configuration")
    if not os.path.exists(spec):
        raise MissingFileError(f"--model {spec!r} is neither a preset ({', '.join(list_presets())}) "
                                "nor a checkpoint or run folder")
    from ..runs import load_model

    model, meta = load_model(spec)
    return model, f"checkpoint {spec} (epoch {meta.get('epoch', '?')})"


def _run_model(args: argparse.Namespace) -> int:
    """``attncnn theorem --model``: one layer of a network against its extracted convolution."""
    import torch

    from .model_layer import layer_as_conv

    given = [f"--{name}" for name in ("kernel", "dilation", "stride", "padding", "in_channels", "out_channels",
                                       "alpha", "conv_from") if getattr(args, name) is not None]
    if given:
        raise InputError(f"{', '.join(o.replace('_', '-') for o in given)}: these options describe a convolution "
                         "to build; with --model the kernel comes from the network's layer: leave them out "
                         "(locality strength: --set locality_strength=...)")
    args.dtype = args.dtype or "float32"
    model, model_source = _model(args)
    in_chans = getattr(getattr(model, "config", None), "in_chans", 3)
    x, image_source = _images(args, in_chans, getattr(torch, args.dtype))
    check = layer_as_conv(model, x, layer=args.layer)
    report = check.conv.report
    result = {
        "theorem": "Cordonnier et al. 2020, Theorem 1, in a network",
        "model": model_source, "layer": check.layer, "attention": check.kind, "init": check.init,
        "locality_strength": check.alpha, "dtype": args.dtype, "images": image_source,
        "kernel_size": report.kernel_size, "dilation": report.dilation, "heads": len(report.heads),
        "grid": list(report.grid), "max_center_distance": report.max_center_distance,
        "min_target_mass": min(h.target_mass for h in report.heads),
        "lemma2_off_target_mass": check.lemma2_off_target,
        "max_abs_error": report.errors["max_abs"], "relative_error": report.errors["relative"],
        "max_abs_conv": report.errors["max_abs_reference"],
        "per_head": [{"head": h.head, "center": list(h.center), "tap": None if h.tap is None else list(h.tap),
                      "distance": h.distance, "target_mass": h.target_mass} for h in report.heads],
    }
    if args.json:
        print(json.dumps(result))
        return 0
    k = report.kernel_size
    print(f"Theorem 1 in a network: layer {check.layer} ({check.kind}, {len(report.heads)} heads) of {model_source}")
    print(f"against the closest {k}x{k} convolution (each head's folded value matrix on the tap of its centre); "
          f"inputs: the layer's input for {image_source}, {args.dtype}")
    if check.alpha is not None:
        print(f"init=conv, locality strength alpha {check.alpha:g}: Lemma 2 allows {check.lemma2_off_target:.2e} "
              "of an interior query's attention off its target")
    print()
    print("| head | centre (row, col) | tap | distance | target mass |")
    print("|---|---|---|---|---|")
    for h in report.heads:
        tap = "-" if h.tap is None else f"{h.tap}"
        dist = "-" if h.distance is None else f"{h.distance:.3f}"
        print(f"| {h.head} | ({h.center[0]:+.2f}, {h.center[1]:+.2f}) | {tap} | {dist} | {h.target_mass:.3f} |")
    print()
    print("| region | max abs error | relative to max abs conv |")
    print("|---|---|---|")
    for region in ("interior", "border", "all"):
        print(f"| {region} | {_fmt(report.errors['max_abs'][region])} | {_fmt(report.errors['relative'][region])} |")
    print()
    rel = report.errors["relative"]["interior"]
    # Rounding alone stays far below these (float32: ~1e-6 relative over a 576-term sum).
    tolerance = 1e-4 if args.dtype == "float32" else 1e-10
    verdict = "equals" if rel is not None and rel < tolerance else "differs from"
    print(f"layer {check.layer} {verdict} a {k}x{k} convolution in the interior (relative error {_fmt(rel)}); the "
          "border differs by design: attention renormalises over the tokens that exist, the convolution reads "
          "zero padding")
    return 0
