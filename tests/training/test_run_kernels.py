"""The run-time kernels of a training step: the optimizer's fused kernel (``fused_optimizer``: the
same steps to float32 rounding, checkpoints that resume with either kernel) and ``compile_mode``'s
CUDA graphs through the loop (each step marked before it runs, nothing of a step kept past the
next one's start). CUDA graphs themselves need a GPU: on the CPU, inductor's reduce-overhead mode
skips them and compiles what the default mode compiles, so these tests stand a plain network in
for the compiled one and check what the loop does around it."""

from __future__ import annotations

import copy
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attncnn.models import build_model
from attncnn.perf import make_plan, resume_plan
from attncnn.runs import load_checkpoint, resolve_config
from attncnn.runs.machine_file import MACHINE_FILE
from attncnn.training import LRSchedule, RunOptions, RunPlan, TrainingInterrupted, train
from attncnn.training import loop as loop_module
from attncnn.training.components import make_optimizer
from attncnn.training.step import training_step

STEPS = 12                                 # 2 epochs of 60 images at batch 10
#: how far two kernels' weights may drift apart in ``n`` float32 steps, per unit of the largest
#: weight: each step may round each weight's update differently by about one unit in the last
#: place (``eps`` of the largest weight), and such differences add up over the steps. Measured on
#: the 2-core AMD EPYC (torch 2.13.0): SGD 2.0e-8 (0 on some models), AdamW 1.4e-8 after 10 steps,
#: where the bound is 1.2e-6.


def _bound(steps: int) -> float:
    return steps * torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def tiny(make_tiny_data, tmp_path_factory) -> tuple[Path, Path]:
    """(data folder: 3 classes, 20 train and 6 test PNGs each, decoded-data cache)."""
    return make_tiny_data(20, 6), tmp_path_factory.mktemp("cache")


def _config(tiny):
    return resolve_config("demo", data=str(tiny[0]), epochs=2, batch_size=10, checkpoint_every=1,
                          model={"dim": 16, "mlp_dim": 16})


def _options(tiny, **overrides) -> RunOptions:
    return RunOptions(**{"data_dir": str(tiny[1]), "device": "cpu", "deterministic": True, "precision": "fp32",
                         "compile": False, **overrides})


def _segments(run: Path) -> list[dict]:
    return json.loads((run / MACHINE_FILE).read_text())["segments"]


def _metrics(run: Path) -> list[dict]:
    timing = {"seconds", "images_per_second", "eval_seconds"}
    return [{k: v for k, v in json.loads(line).items() if k not in timing}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def _last(run: Path) -> Path:
    return run / "checkpoints" / "last.safetensors"


@pytest.fixture(scope="module")
def reference_run(tiny, tmp_path_factory) -> Path:
    """An uninterrupted run on the default (foreach) kernel."""
    out = tmp_path_factory.mktemp("reference") / "run"
    train(_config(tiny), out, make_plan(_config(tiny), _options(tiny)), progress=False)
    return out


def _trained(checkpoint: Path) -> dict:
    """The weights and optimizer tensors of a checkpoint (``model.*``, ``optim.*``; not the random states)."""
    return {k: v for k, v in load_file(str(checkpoint)).items() if k.startswith(("model.", "optim."))}


def _max_difference(a: dict, b: dict) -> tuple[float, float]:
    """(largest difference, largest magnitude) over the tensors both dicts hold under the same names."""
    assert a.keys() == b.keys()
    return (max((a[k].double() - b[k].double()).abs().max().item() for k in a),
            max(a[k].abs().max().item() for k in a))


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_fused_kernel_takes_the_same_steps_to_float32_rounding(optimizer):
    """10 fp32 steps of the trainer's optimizer with the fused kernel, against the default one (a loop
    over the tensors on the CPU) and the foreach kernels (CUDA's default): the same state keys, the
    same weights within :func:`_bound`, while the steps move them far more than that."""
    recipe = {"optimizer": "adamw", "lr": 5e-4, "weight_decay": 0.05} if optimizer == "adamw" else {}
    config = resolve_config("demo", **recipe)
    torch.manual_seed(0)
    start = build_model("demo", num_classes=10, dim=16, mlp_dim=16).train()
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 3, 32, 32, generator=generator), torch.randint(0, 10, (8,), generator=generator))
               for _ in range(10)]
    trained = {}
    for kernel in ("default", "foreach", "fused"):
        model = copy.deepcopy(start)
        opt = make_optimizer(model, config, fused=kernel == "fused")
        for group in opt.param_groups if kernel == "foreach" else ():
            group["foreach"] = True
        for images, labels in batches:
            training_step(model, opt, images, labels, "fp32")
        trained[kernel] = (model.state_dict(), opt.state_dict())
    assert [g["fused"] for g in trained["fused"][1]["param_groups"]] == [True, True]
    assert [g["fused"] for g in trained["default"][1]["param_groups"]] == [None, None]     # built as before
    moved, _ = _max_difference(trained["default"][0], start.state_dict())
    for kernel in ("default", "foreach"):
        (weights, state), (fused_weights, fused_state) = trained[kernel], trained["fused"]
        # the same entries: a checkpoint of either loads into the other
        assert {i: sorted(s) for i, s in state["state"].items()} == {
            i: sorted(s) for i, s in fused_state["state"].items()}
        assert [sorted(g) for g in state["param_groups"]] == [sorted(g) for g in fused_state["param_groups"]]
        difference, largest = _max_difference(weights, fused_weights)
        assert difference <= _bound(10) * largest < moved / 100


def _signal_at(monkeypatch, epoch: int, step: int) -> None:
    """SIGTERM to this process while batch ``step`` of ``epoch`` (0-based) is trained."""
    real = LRSchedule.set_lr

    def set_lr(self, optimizer, e, s):
        if (e, s) == (epoch, step):
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, optimizer, e, s)

    monkeypatch.setattr(LRSchedule, "set_lr", set_lr)


@pytest.mark.parametrize("written_fused", [True, False])
def test_a_checkpoint_resumes_with_the_other_optimizer_kernel(tiny, reference_run, tmp_path, monkeypatch,
                                                             written_fused):
    """A run stopped in epoch 2 on one kernel resumes on the other: the checkpoint names its
    writer's kernel, the resumed segment trains (and checkpoints) with its own, and the run ends where
    the uninterrupted one does, within the float32 bound of its steps."""
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _signal_at(m, epoch=1, step=2)
        with pytest.raises(TrainingInterrupted) as info:
            train(_config(tiny), out, make_plan(_config(tiny), _options(tiny, fused_optimizer=written_fused)),
                  progress=False)
    assert ("--fused-optimizer" in str(info.value)) is written_fused       # the --resume command repeats it
    groups = load_checkpoint(_last(out)).optimizer_state["param_groups"]
    assert {g["fused"] for g in groups} == {True if written_fused else None}
    train(None, out, resume_plan(out, _options(tiny, fused_optimizer=not written_fused)), mode="resume",
          progress=False)
    groups = load_checkpoint(_last(out)).optimizer_state["param_groups"]
    assert {g["fused"] for g in groups} == {None if written_fused else True}
    assert [s["fused_optimizer"] for s in _segments(out)] == [written_fused, not written_fused]
    difference, largest = _max_difference(*(_trained(_last(run)) for run in (reference_run, out)))
    assert difference <= _bound(STEPS) * largest
    assert [r["epoch"] for r in _metrics(out)] == [1, 2]


def _graph_runs(tiny, tmp_path, monkeypatch, mode: str) -> tuple[Path, list[str], list[dict]]:
    """A run of a plan that compiles in ``mode``, with ``torch.compile`` standing the plain network
    in for the compiled one (no CUDA graphs here) and each step's mark imitating what CUDA graphs do
    to the previous step's outputs: overwritten (here with NaN). Returns (run folder, the sequence of
    marks and steps, the arguments ``torch.compile`` got)."""
    events, compiled, outputs = [], [], []
    real_mark = torch.compiler.cudagraph_mark_step_begin

    def mark():
        real_mark()
        events.append("mark")
        with torch.no_grad():
            for tensor in outputs:                          # the previous step's memory is reused
                tensor.fill_(float("nan"))
        outputs.clear()

    def step(*args, **kwargs):
        events.append("step")
        loss, logits = training_step(*args, **kwargs)
        outputs.extend((loss, logits))
        return loss, logits

    monkeypatch.setattr(torch, "compile", lambda net, **kwargs: compiled.append(kwargs) or net)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", mark)
    monkeypatch.setattr(loop_module, "training_step", step)
    options = _options(tiny, compile=True)
    plan = RunPlan(device=torch.device("cpu"), precision="fp32", compile=True, compile_mode=mode, deterministic=True,
                   options=options)
    out = tmp_path / mode
    train(_config(tiny), out, plan, progress=False)
    return out, events, compiled


@pytest.mark.parametrize("mode", ["reduce-overhead", "default"])
def test_cuda_graph_mode_marks_each_step_before_it_and_keeps_nothing_of_it(tiny, reference_run, tmp_path,
                                                                          monkeypatch, mode):
    """With ``compile_mode="reduce-overhead"`` the loop compiles in that mode and marks every step
    before it runs; overwriting each step's loss and logits at the next mark changes no number of
    the run (nothing reads them after their step), which trains exactly as the plain run does. In the
    default mode nothing is marked. ``machine.json`` records the mode of a compiled segment only."""
    run, events, compiled = _graph_runs(tiny, tmp_path, monkeypatch, mode)
    assert compiled == [{"dynamic": False, "mode": mode}]
    assert events == (["mark", "step"] if mode == "reduce-overhead" else ["step"]) * STEPS
    assert [{k: v for k, v in r.items() if k != "compiled"} for r in _metrics(run)] == [
        {k: v for k, v in r.items() if k != "compiled"} for r in _metrics(reference_run)]
    plain, this = load_file(str(_last(reference_run))), load_file(str(_last(run)))
    assert plain.keys() == this.keys() and all(torch.equal(plain[k], this[k]) for k in plain)
    assert [(s["compiled"], s["compile_mode"]) for s in _segments(run)] == [(True, mode)]
    assert "compile_mode" not in _segments(reference_run)[0]
