"""Theorem 1 measured, as ``attncnn theorem`` prints it: the attention layer built to equal a
convolution (:func:`check_theorem`), or one layer of a network against its closest convolution
(:func:`check_model_layer`), each run against :func:`torch.nn.functional.conv2d` on the same images:
seeded standard-normal ones unless a data set is named."""

from __future__ import annotations

import os
import time

from ..errors import InputError, MissingFileError

__all__ = ["DTYPES", "check_theorem", "check_model_layer"]

#: the floating-point types a check runs in
DTYPES = ("float64", "float32")


def _checked_kernel(conv_from: str, given: dict, stride: int | None, padding: str | None, dtype):
    """(weight, bias, stride, dilation, padding, description) of a checkpoint's first convolution."""
    from torch import nn

    from ..runs import load_model
    from .construct import _conv_parts

    model, _ = load_model(conv_from)
    conv = getattr(model, "conv1", None)
    name = "model.conv1"
    if not isinstance(conv, nn.Conv2d):
        named = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
        if not named:
            raise InputError(f"checkpoint {conv_from} holds no Conv2d layer")
        name, conv = named[0]
    # Validates the layer (odd square kernel, groups 1, zero padding) and reads its geometry.
    weight, bias, own_stride, dilation, own_padding = _conv_parts(conv, None, None, None, None, 2, nn.Conv2d)
    actual = {"kernel": weight.shape[-1], "in-channels": weight.shape[1], "out-channels": weight.shape[0],
              "dilation": dilation}
    for option, value in given.items():
        if value is not None and value != actual[option]:
            raise InputError(f"--{option} {value} contradicts the checkpoint's {name} ({actual[option]}); leave it out")
    # stride and padding may change how the checkpoint's kernel is applied: the description says so
    changed = [f"{option} {new!r} instead of its {own!r}" for option, new, own in
               (("stride", stride, own_stride), ("padding", padding, own_padding)) if new not in (None, own)]
    return (weight.to(dtype), None if bias is None else bias.to(dtype), own_stride if stride is None else stride,
            dilation, padding or own_padding,
            f"checkpoint {conv_from} ({name}{', ' if changed else ''}{', '.join(changed)})")


def _kernel(kernel, dilation, stride, padding, in_channels, out_channels, conv_from, seed, dtype):
    """(weight, bias, stride, dilation, padding, description): a random kernel or a checkpoint's."""
    import torch

    if conv_from:
        given = {"kernel": kernel, "in-channels": in_channels, "out-channels": out_channels, "dilation": dilation}
        return _checked_kernel(conv_from, given, stride, padding, dtype)
    k = 3 if kernel is None else kernel
    c_in = 3 if in_channels is None else in_channels
    c_out = 16 if out_channels is None else out_channels
    if k < 1 or k % 2 == 0:
        raise InputError(f"--kernel must be odd and positive, got {k}")
    if c_in < 1 or c_out < 1:
        raise InputError(f"--in-channels and --out-channels must be positive, got {c_in}, {c_out}")
    gen = torch.Generator().manual_seed(seed)
    # PyTorch's default Conv2d scale: uniform in +-1/sqrt(fan_in), for weight and bias.
    bound = 1.0 / (c_in * k * k) ** 0.5
    weight = (torch.rand(c_out, c_in, k, k, generator=gen, dtype=torch.float64) * 2 - 1) * bound
    bias = (torch.rand(c_out, generator=gen, dtype=torch.float64) * 2 - 1) * bound
    return (weight.to(dtype), bias.to(dtype), 1 if stride is None else stride, 1 if dilation is None else dilation,
            padding or "same", f"random (seed {seed})")


#: the size of the random images used where no data set is named: CIFAR's, which the presets are built for
RANDOM_IMAGE_SIZE = (32, 32)


def _images(data: str | None, data_dir: str | None, count: int, c_in: int, dtype, seed: int = 0):
    """Normalised test images ``(N, C_in, H, W)`` and a description of their source: those of the
    data set ``data``, or with none named, standard-normal images of :data:`RANDOM_IMAGE_SIZE` drawn
    with ``seed`` (Theorem 1 is an identity for every input, so no download is needed to check it)."""
    import torch

    from ..data import CIFAR_MEAN, CIFAR_STD, load_dataset

    if data is None:
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(count, c_in, *RANDOM_IMAGE_SIZE, generator=gen, dtype=torch.float64)
        return x.to(dtype), (f"{count} random images {RANDOM_IMAGE_SIZE} (standard normal, seed {seed}; "
                             "--data for real ones)")
    dataset = load_dataset(data, data_dir=data_dir)
    raw = dataset.test.images[:count]
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


def check_theorem(*, kernel: int | None = None, dilation: int | None = None, stride: int | None = None,
                  padding: str | None = None, in_channels: int | None = None, out_channels: int | None = None,
                  alpha: float | None = None, dtype: str = "float64", images: int = 100, data: str | None = None,
                  data_dir: str | None = None, conv_from: str | None = None, seed: int = 0,
                  repeats: int = 3) -> dict:
    """Build the ``K*K``-head quadratic attention layer equal to a ``KxK`` convolution (paper
    Theorem 1, :func:`~attncnn.theory.attention_from_conv2d`) and run both on the same images.

    Args:
        kernel, dilation, stride, padding, in_channels, out_channels: the convolution (defaults
            3, 1, 1, ``"same"``, 3, 16); a random kernel (PyTorch's default Conv2d scale, ``seed``),
            or with ``conv_from`` the first convolution of that checkpoint (whose geometry the
            options may not contradict).
        alpha: sharpness of every head (default: exactly one-hot in ``dtype``).
        dtype: ``"float64"`` or ``"float32"``.
        images: how many test images of ``data`` (normalised, channels repeated cyclically to fill
            ``in_channels``); ``data`` None (default): standard-normal 32 x 32 images drawn with ``seed``.
        repeats: timing repetitions; the best is reported.

    Returns:
        The geometry, ``max_abs_error`` / ``relative_error`` per region (interior, border, all),
        ``max_abs_conv``, ``lemma2`` (off-target mass and output bound for the alpha used) and
        ``seconds`` (build, conv, attention).

    Raises:
        InputError: an even or non-positive kernel, bad channel counts or counts, options that
            contradict the checkpoint, images smaller than a 'valid' kernel's extent.
        attncnn.data.DataError, MissingFileError: the data or checkpoint cannot be read.
    """
    import torch
    import torch.nn.functional as F

    from .construct import attention_from_conv2d
    from .extract import interior_mask, output_errors
    from .lemma2 import lemma2_bound

    if images < 1 or repeats < 1:
        raise InputError(f"--images and --repeats must be positive, got {images}, {repeats}")
    weight, bias, stride, dilation, padding, kernel_source = _kernel(
        kernel, dilation, stride, padding, in_channels, out_channels, conv_from, seed, getattr(torch, dtype))
    c_out, c_in, k, _ = weight.shape
    x, image_source = _images(data, data_dir, images, c_in, getattr(torch, dtype), seed)
    pad = (k // 2) * dilation
    if padding == "valid" and min(x.shape[2:]) <= 2 * pad:
        raise InputError(f"'valid' padding needs images at least as large as the kernel extent {2 * pad + 1}")
    with torch.no_grad():
        start = time.perf_counter()
        module = attention_from_conv2d(weight, bias=bias, stride=stride, dilation=dilation, padding=padding,
                                       alpha=alpha)
        build_s = time.perf_counter() - start
        x_last = x.permute(0, 2, 3, 1).contiguous()
        ref, conv_s = _best_time(lambda: F.conv2d(x, weight, bias, stride, pad if padding == "same" else 0,
                                                  dilation).permute(0, 2, 3, 1), repeats)
        out, attn_s = _best_time(lambda: module(x_last), repeats)
        errors = output_errors(out, ref, interior_mask(tuple(x.shape[2:]), pad=pad, stride=stride, padding=padding))
        bound = lemma2_bound(module, x_last)
    scale = errors["max_abs_reference"]
    return {
        "theorem": "Cordonnier et al. 2020, Theorem 1",
        "kernel_size": k, "dilation": dilation, "stride": stride, "padding": padding,
        "in_channels": c_in, "out_channels": c_out, "heads": k * k, "dtype": dtype,
        "alpha": float(module.alpha.detach()[0]), "alpha_is_default": alpha is None, "kernel": kernel_source,
        "images": image_source, "input_shape": list(x_last.shape), "output_shape": list(out.shape),
        "max_abs_error": errors["max_abs"], "relative_error": errors["relative"], "max_abs_conv": scale,
        "lemma2": {"off_target_mass": bound.max_off_target_mass, "output_bound": bound.output_bound,
                   "relative_bound": bound.output_bound / scale if scale > 0 else None},
        "seconds": {"build": build_s, "conv": conv_s, "attention": attn_s},
    }


def _model(spec: str, overrides: dict, seed: int):
    """``(model, description)``: a preset built at step 0, or a checkpoint's network."""
    import torch

    from ..models import build_model, list_presets

    if spec in list_presets():
        torch.manual_seed(seed)
        settings = "".join(f", {k}={v!r}" for k, v in overrides.items())
        return build_model(spec, **overrides), f"preset {spec} at step 0 (seed {seed}{settings})"
    if overrides:
        raise InputError(f"--set changes a preset, but {spec!r} is not one; a checkpoint keeps its configuration")
    if not os.path.exists(spec):
        raise MissingFileError(f"--model {spec!r} is neither a preset ({', '.join(list_presets())}) "
                               "nor a checkpoint or run folder")
    from ..runs import load_model

    model, meta = load_model(spec)
    return model, f"checkpoint {spec} (epoch {meta.get('epoch', '?')})"


def check_model_layer(model: str, *, layer: int = 1, overrides: dict | None = None, seed: int = 0,
                      dtype: str = "float32", images: int = 100, data: str | None = None,
                      data_dir: str | None = None) -> dict:
    """One layer of a network against its closest convolution on the layer's real input
    (:func:`~attncnn.theory.layer_as_conv`).

    Args:
        model: a preset (built at step 0 with ``seed`` and ``overrides``, its model options) or a
            checkpoint / run folder.
        layer: the block to check (1-based).
        dtype, images, data, data_dir: as for :func:`check_theorem`.

    Returns:
        The model and layer, ``per_head`` (center, tap, distance, target mass), the errors per
        region, and Lemma 2's off-target mass for the layer's locality strength.

    Raises:
        InputError: ``overrides`` for a checkpoint, a layer that does not exist, a layer that is
            not positional attention. MissingFileError: neither a preset nor a path.
    """
    import torch

    from .model_layer import layer_as_conv

    if images < 1:
        raise InputError(f"--images must be positive, got {images}")
    network, model_source = _model(model, dict(overrides or {}), seed)
    in_chans = getattr(getattr(network, "config", None), "in_chans", 3)
    x, image_source = _images(data, data_dir, images, in_chans, getattr(torch, dtype), seed)
    check = layer_as_conv(network, x, layer=layer)
    report = check.conv.report
    return {
        "theorem": "Cordonnier et al. 2020, Theorem 1, in a network",
        "model": model_source, "layer": check.layer, "attention": check.kind, "init": check.init,
        "locality_strength": check.alpha, "dtype": dtype, "images": image_source,
        "kernel_size": report.kernel_size, "dilation": report.dilation, "heads": len(report.heads),
        "grid": list(report.grid), "max_center_distance": report.max_center_distance,
        "min_target_mass": min(h.target_mass for h in report.heads),
        "lemma2_off_target_mass": check.lemma2_off_target,
        "max_abs_error": report.errors["max_abs"], "relative_error": report.errors["relative"],
        "max_abs_conv": report.errors["max_abs_reference"],
        "per_head": [{"head": h.head, "center": list(h.center), "tap": None if h.tap is None else list(h.tap),
                      "distance": h.distance, "target_mass": h.target_mass} for h in report.heads],
    }
