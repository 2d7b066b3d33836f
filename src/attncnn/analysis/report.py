"""Table 1 for trained runs (the paper's Table 1): accuracy, size, compute and speed beside the paper's numbers.

* accuracy: the test accuracy of the last epoch, and the best over epochs (*selected on the test
  set*, as the reference code does: there is no validation split);
* parameters: trainable parameter values (:func:`attncnn.models.count_parameters`);
* MACs per image: FLOPs of one forward pass of one ``3 x S x S`` image counted by
  :class:`torch.utils.flop_counter.FlopCounterMode` (matrix products, convolutions, attention
  kernels), halved (1 MAC = 2 FLOPs); softmax, normalisation and other element-wise operations are
  not counted, and the paper's "# FLOPS" convention is unstated, so compare ratios;
* images/s: batch size / median wall time of a step (training: forward, cross-entropy, backward,
  SGD update; inference: forward under ``no_grad``) on random images, on this machine
  (:mod:`attncnn.perf.bench.harness`).
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..errors import InputError
from ..layers import attention_modules, dense_attention
from ..models import build_model, count_parameters, get_preset
from ..perf.bench.harness import time_steps
from .runs import Run, shareable_dataset

__all__ = ["macs_per_image", "paper_flops_per_image", "throughput", "run_row", "preset_row", "report_rows",
           "markdown_table", "text_table"]


def _dense_pass(model: nn.Module, image_size: int, in_chans: int) -> None:
    """One forward pass of one zero image in eval mode (restored after) on the dense attention path
    (the paper's convention), which calls every linear layer as a module (the folded path uses the
    output map's weight directly)."""
    was_training = model.training
    model.eval()
    try:
        with dense_attention(model):
            model(torch.zeros(1, in_chans, image_size, image_size, device=next(model.parameters()).device))
    finally:
        model.train(was_training)


@torch.no_grad()
def macs_per_image(model: nn.Module, image_size: int = 32, in_chans: int = 3) -> int:
    """Multiply-accumulates of one forward pass of one image (see the module docstring).

    Raises:
        ValueError: an image size the model cannot take.
    """
    with FlopCounterMode(display=False) as counter:
        _dense_pass(model, image_size, in_chans)
    return counter.get_total_flops() // 2


@torch.no_grad()
def paper_flops_per_image(model: nn.Module, image_size: int = 32, in_chans: int = 3) -> int:
    """The paper's "# FLOPS" of Table 1 for ``model``, one image: a reconstruction of its convention.

    The paper's numbers fit 2 x the multiply-accumulates of the linear layers only for the attention
    models (attention products left out: 6.18 B for the quadratic model, 15.0 B for the content one,
    the paper's 6.2 B and 15 B) and the plain multiply-accumulates of every layer for ResNet18
    (0.56 B); so: 2 x linear-layer MACs for a model with attention layers, :func:`macs_per_image`
    otherwise.

    Raises:
        ValueError: an image size the model cannot take.
    """
    if not attention_modules(model):
        return macs_per_image(model, image_size, in_chans)
    total = [0]

    def count(module: nn.Linear, _inputs, output: torch.Tensor) -> None:
        total[0] += module.in_features * output.numel()       # output.numel() = rows x out_features

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        _dense_pass(model, image_size, in_chans)        # on the dense path a hook sees every linear layer
    finally:
        for hook in hooks:
            hook.remove()
    return 2 * total[0]


def throughput(model: nn.Module, *, batch_size: int = 32, image_size: int = 32, reps: int = 2,
               device: str | torch.device = "cpu") -> dict[str, float]:
    """Training and inference images/s of a copy of ``model`` (the model itself is not changed).

    Returns:
        ``{"train_images_per_s", "infer_images_per_s", "batch_size"}``.
    """
    dev = torch.device(device)
    net = copy.deepcopy(model).to(dev)
    classes = getattr(getattr(net, "config", None), "num_classes", 10)
    images = torch.randn(batch_size, 3, image_size, image_size, device=dev)
    labels = torch.randint(0, classes, (batch_size,), device=dev)
    timing = time_steps(net, images, labels, warmup=1, reps=reps)
    return {"train_images_per_s": batch_size / timing["step_seconds"],
            "infer_images_per_s": batch_size / timing["infer_seconds"], "batch_size": batch_size}


#: The paper's "# FLOPS" column of Table 1 (recalled, convention unstated).
PAPER_FLOPS = {"resnet18": "0.56 B", "quadratic": "6.2 B", "learned": "6.2 B", "learned-content": "15 B"}


def _paper(preset: str | None) -> dict:
    """The preset's Table 1 entry plus the paper's FLOPS text where the paper gives one."""
    try:
        paper = {} if preset is None else dict(get_preset(preset).paper)
    except ValueError:
        return {}
    return {**paper, "flops": PAPER_FLOPS[preset]} if preset in PAPER_FLOPS else paper


def _row(model: nn.Module, name: str, preset: str | None, *, speed: bool, batch_size: int, image_size: int,
         reps: int, **trained) -> dict:
    """A Table 1 row of ``model``; ``trained``: the entries only a trained run has (epochs, accuracies, ...)."""
    row = {"run": name, "preset": preset, "model": _describe(model), "epochs": None, "dataset": None,
           "last_accuracy": None, "best_accuracy": None, "best_epoch": None, "best_selected_on": "test",
           "parameters": count_parameters(model), "macs_per_image": macs_per_image(model, image_size),
           "train_images_per_s": None, "infer_images_per_s": None, "paper": _paper(preset), **trained}
    if speed:
        row.update({k: v for k, v in throughput(model, batch_size=batch_size, image_size=image_size,
                                                reps=reps).items() if k != "batch_size"})
    return row


def run_row(run: Run, *, speed: bool = True, batch_size: int = 32, image_size: int = 32, reps: int = 2) -> dict:
    """One Table 1 row for a trained run.

    Returns:
        ``{"run", "preset", "model", "epochs", "dataset", "last_accuracy", "best_accuracy",
        "best_epoch", "best_selected_on": "test", "parameters", "macs_per_image",
        "train_images_per_s", "infer_images_per_s", "paper": {...}}`` (accuracies as fractions;
        speeds None when ``speed`` is False; accuracies None without logged metrics).
    """
    records = [r for r in run.metrics if isinstance(r.get("test_accuracy"), (int, float))]
    last = records[-1] if records else None
    best = max(records, key=lambda r: r["test_accuracy"]) if records else None
    if last is None and isinstance(run.metadata.get("metrics"), dict):
        last = run.metadata["metrics"]                      # bare checkpoint: its own epoch's record
    return _row(run.model, run.name, run.metadata.get("config", {}).get("preset"), speed=speed,
                batch_size=batch_size, image_size=image_size, reps=reps,
                epochs=last.get("epoch") if last else run.metadata.get("epoch"),
                dataset=shareable_dataset(run.metadata),      # reports get shared: no local path
                last_accuracy=last.get("test_accuracy") if last else None,
                best_accuracy=best["test_accuracy"] if best else None, best_epoch=best["epoch"] if best else None)


def preset_row(name: str, *, speed: bool = False, batch_size: int = 32, image_size: int = 32, reps: int = 2,
               **overrides) -> dict:
    """A Table 1 row for an untrained preset (sizes, compute and speed only; no accuracy).

    Raises:
        ValueError: unknown preset or override.
    """
    return _row(build_model(name, **overrides), f"preset:{name}", name, speed=speed, batch_size=batch_size,
                image_size=image_size, reps=reps)


def _describe(model: nn.Module) -> str:
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "attention"):
        heads = cfg.heads()
        if len(set(heads)) == 1:
            return f"{cfg.attention} SA, {cfg.num_layers} layers x {heads[0]} heads, D={cfg.dim}"
        # a pruned model: the head count of every layer
        return f"{cfg.attention} SA, {cfg.num_layers} layers, heads {'/'.join(map(str, heads))}, D={cfg.dim}"
    return type(model).__name__


def _fmt(value, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _cells(row: dict) -> list[str]:
    paper = row.get("paper") or {}
    best = _fmt(row["best_accuracy"], ".4f")
    if row["best_epoch"] is not None:
        best += f" (ep {row['best_epoch']})"
    return [row["run"], row["model"], _fmt(row["last_accuracy"], ".4f"), best, f"{row['parameters']:,}",
            f"{row['macs_per_image'] / 1e9:.3f}", _fmt(row["train_images_per_s"], ".1f"),
            _fmt(row["infer_images_per_s"], ".1f"), _fmt(row["epochs"], "d"), row["dataset"] or "-",
            _fmt(paper.get("accuracy"), ".3f"), paper.get("params") or "-", paper.get("flops") or "-"]


_HEADER = ["run", "model", "test acc. (last)", "best* (epoch)", "params", "GMAC/img", "train img/s",
           "infer img/s", "epochs", "dataset", "paper acc.", "paper params", "paper FLOPS"]

FOOTNOTE = ("*best: the highest test accuracy over epochs, i.e. selected on the test set as in the reference "
            "code. GMAC/img: multiply-accumulates of one forward pass (matrix products, convolutions, "
            "attention; FlopCounterMode FLOPs / 2). img/s measured on this machine.")


def report_rows(paths: Sequence[str], presets: Sequence[str] = (), *, speed: bool = True, batch_size: int = 32,
                image_size: int = 32, precision: str = "fp32") -> list[dict]:
    """Table 1 rows (``attncnn report``): :func:`run_row` of each run folder or checkpoint in
    ``paths`` (labelled ``"<preset> seed <seed>"``, made distinct), then :func:`preset_row` of each
    untrained preset in ``presets``; ``speed``: measure images/s (batches of ``batch_size``
    ``image_size``-pixel images) with forward passes in ``precision``.

    Raises:
        InputError: neither runs nor presets. MissingFileError: a run that is not there.
    """
    from ..perf.precision import running_at
    from .runs import label_runs, open_run

    if not paths and not presets:
        raise InputError("give at least one RUN or --preset NAME")
    kwargs = {"speed": speed, "batch_size": batch_size, "image_size": image_size}
    with running_at(precision):
        rows = [run_row(run, **kwargs) for run in label_runs([open_run(path) for path in paths])]
        return rows + [preset_row(name, **kwargs) for name in presets]


def markdown_table(rows: Sequence[dict]) -> str:
    """Rows of :func:`run_row`/:func:`preset_row` as a GitHub Markdown table with a footnote."""
    lines = ["| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n\n" + FOOTNOTE + "\n"


def text_table(rows: Sequence[dict]) -> str:
    """Rows as aligned plain text with a footnote."""
    table = [_HEADER] + [_cells(r) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(_HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    return "\n".join(lines) + "\n" + FOOTNOTE + "\n"
