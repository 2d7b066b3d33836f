"""``attncnn theorem``: build the attention layer of Theorem 1 and check it against the convolution.

Runs both on the same images (seeded standard-normal images, or ``--data``'s test images) and
prints the errors (interior, border, all), the Lemma 2 bound and timings. With ``--model`` it
checks one layer of that network against its closest convolution (:mod:`attncnn.theory.checks`).
"""

from __future__ import annotations

import argparse
import json

from ..errors import InputError
from ..theory.checks import DTYPES
from ._parsing import key_value, run_or_model

__all__ = ["register", "handle"]


def register(sub) -> None:
    p = sub.add_parser(
        "theorem", help="build the self-attention layer equal to a convolution and measure the difference",
        description="Theorem 1 of Cordonnier et al. (2020) as code: a K*K-head quadratic self-attention layer "
                    "built to equal a KxK convolution, run against torch.nn.functional.conv2d on the same images: "
                    "seeded random ones by default (no download), a data set's test images with --data.")
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
    p.add_argument("--images", type=int, default=100, help="number of images, random or of --data (default 100)")
    p.add_argument("--data", help="data set of the test images, as for train (cifar10, cifar100, a folder or zip); "
                                  "default: random standard-normal 32x32 images, which need no download")
    p.add_argument("--data-dir",
                   help="cache folder for official archives (default: $ATTNCNN_DATA_DIR or ~/.cache/attncnn)")
    p.add_argument("--conv-from", metavar="CHECKPOINT", type=run_or_model,
                   help="use the first convolution (model.conv1) of a trained checkpoint, e.g. a ResNet18 (a run "
                        "folder, a checkpoint file, or a trained model's name: resnet18-mini)")
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
    p.set_defaults(handler=handle)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2e}"


def handle(args: argparse.Namespace) -> int:
    """Run ``attncnn theorem``; prints the result and returns the exit status (0).

    Raises:
        InputError: bad options (even kernel, contradicting a checkpoint, options of the other mode).
        attncnn.data.DataError, FileNotFoundError, OSError: the data or checkpoint cannot be read.
    """
    from ..theory.checks import check_model_layer, check_theorem

    if args.images < 1 or args.repeats < 1:
        raise InputError(f"--images and --repeats must be positive, got {args.images}, {args.repeats}")
    if args.model:
        given = [f"--{name}" for name in ("kernel", "dilation", "stride", "padding", "in_channels", "out_channels",
                                           "alpha", "conv_from") if getattr(args, name) is not None]
        if given:
            raise InputError(f"{', '.join(o.replace('_', '-') for o in given)}: these options describe a convolution "
                             "to build; with --model the kernel comes from the network's layer: leave them out "
                             "(locality strength: --set locality_strength=...)")
        result = check_model_layer(args.model, layer=args.layer, overrides=dict(args.overrides), seed=args.seed,
                                   dtype=args.dtype or "float32", images=args.images, data=args.data,
                                   data_dir=args.data_dir)
        print(json.dumps(result) if args.json else _model_text(result))
        return 0
    if args.overrides or args.layer != 1:
        raise InputError("--set and --layer apply to --model only; add --model PRESET (e.g. quadratic-conv-mini)")
    result = check_theorem(kernel=args.kernel, dilation=args.dilation, stride=args.stride, padding=args.padding,
                           in_channels=args.in_channels, out_channels=args.out_channels, alpha=args.alpha,
                           dtype=args.dtype or "float64", images=args.images, data=args.data, data_dir=args.data_dir,
                           conv_from=args.conv_from, seed=args.seed, repeats=args.repeats)
    print(json.dumps(result) if args.json else _theorem_text(result, args.repeats))
    return 0


def _error_rows(result: dict) -> list[str]:
    rows = ["| region | max abs error | relative to max abs conv |", "|---|---|---|"]
    for region in ("interior", "border", "all"):
        rows.append(f"| {region} | {_fmt(result['max_abs_error'][region])} | "
                    f"{_fmt(result['relative_error'][region])} |")
    return rows


def _theorem_text(result: dict, repeats: int) -> str:
    import torch

    k, alpha, seconds, lemma2 = result["kernel_size"], result["alpha"], result["seconds"], result["lemma2"]
    return "\n".join([
        f"Theorem 1: {k}x{k} convolution ({result['in_channels']} -> {result['out_channels']} channels, dilation "
        f"{result['dilation']}, stride {result['stride']}, {result['padding']!r} padding) as {k * k}-head quadratic "
        "self-attention",
        f"kernel: {result['kernel']}; inputs: {result['images']}",
        f"dtype {result['dtype']}, alpha {alpha:.2f}" + (" (default: exactly one-hot)" if result["alpha_is_default"]
                                                        else ""),
        "", *_error_rows(result), "",
        f"Lemma 2 (alpha {alpha:.2f}): off-target attention mass <= {lemma2['off_target_mass']:.2e}, "
        f"max abs error <= {lemma2['output_bound']:.2e} (relative {_fmt(lemma2['relative_bound'])}; rounding not "
        "included)",
        f"timings: build {seconds['build'] * 1e3:.1f} ms, conv2d {seconds['conv'] * 1e3:.1f} ms, "
        f"attention {seconds['attention'] * 1e3:.1f} ms (best of {repeats}, {torch.get_num_threads()} threads)"])


def _model_text(result: dict) -> str:
    k, layer, heads = result["kernel_size"], result["layer"], result["per_head"]
    lines = [f"Theorem 1 in a network: layer {layer} ({result['attention']}, {len(heads)} heads) of {result['model']}",
             f"against the closest {k}x{k} convolution (each head's folded value matrix on the tap of its center); "
             f"inputs: the layer's input for {result['images']}, {result['dtype']}"]
    if result["locality_strength"] is not None:
        lines.append(f"init=conv, locality strength alpha {result['locality_strength']:g}: Lemma 2 allows "
                     f"{result['lemma2_off_target_mass']:.2e} of an interior query's attention off its target")
    lines += ["", "| head | center (row, col) | tap | distance | target mass |", "|---|---|---|---|---|"]
    for h in heads:
        tap = "-" if h["tap"] is None else f"{tuple(h['tap'])}"
        dist = "-" if h["distance"] is None else f"{h['distance']:.3f}"
        lines.append(f"| {h['head']} | ({h['center'][0]:+.2f}, {h['center'][1]:+.2f}) | {tap} | {dist} | "
                     f"{h['target_mass']:.3f} |")
    lines += ["", *_error_rows(result), ""]
    rel = result["relative_error"]["interior"]
    # Rounding alone stays far below these (float32: ~1e-6 relative over a 576-term sum).
    tolerance = 1e-4 if result["dtype"] == "float32" else 1e-10
    verdict = "equals" if rel is not None and rel < tolerance else "differs from"
    lines.append(f"layer {layer} {verdict} a {k}x{k} convolution in the interior (relative error {_fmt(rel)}); the "
                 "border differs by design: attention renormalises over the tokens that exist, the convolution "
                 "reads zero padding")
    return "\n".join(lines)
