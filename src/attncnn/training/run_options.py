"""How this machine runs a run: :class:`RunOptions`, the run-time options of ``attncnn train``,
``evaluate`` and ``reproduce``, kept apart from the recipe (:class:`~attncnn.runs.TrainConfig`).

Device, precision, compile, determinism, attention paths and the archives' cache are this
machine's choices: resolved by :func:`attncnn.perf.make_plan` / :func:`attncnn.perf.resume_plan`
into a :class:`~attncnn.training.RunPlan` and recorded per segment in ``machine.json``
(:mod:`attncnn.runs.machine_file`), never in ``config.json`` or a checkpoint.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import InputError
from ..runs.config import PRECISIONS, option

__all__ = ["RunOptions", "COMPILE_MODES"]

#: the ``torch.compile`` modes a run may compile its step in (``"reduce-overhead"``: CUDA graphs, CUDA only)
COMPILE_MODES = ("default", "reduce-overhead")


@dataclass(frozen=True)
class RunOptions:
    """The run-time options of one process run (a segment) of a training run. None means "not
    given": the rule below decides.

    Attributes:
        device: ``"auto"`` (default: CUDA when available, else the CPU), ``"cpu"``, ``"cuda"``,
            ``"cuda:N"``. A resumed run takes this command's, whatever machine started it.
        precision: ``"fp32"``, ``"bf16"`` (mixed precision) or ``"auto"`` (bf16 where the device has
            fast bfloat16 units, else fp32). None (default): ``auto`` for a new run; a resumed run
            keeps its own, but fp32 where bf16 is slow (:func:`attncnn.perf.machine_precision`).
        compile: compile the training step (True), never (False), or None (default): the written
            rule (:func:`attncnn.perf.rule.choose`: never for a run shorter than about ten minutes)
            or, with ``measure_compile``, a measurement
            decides; off with ``deterministic`` and under torchrun unless given.
        compile_mode: one of :data:`COMPILE_MODES`: ``"default"`` or ``"reduce-overhead"`` (CUDA
            graphs, for small models bound by kernel launches; CUDA only, implies ``compile``).
        fused_optimizer: the optimizer's fused kernel instead of its ``foreach`` kernels (default
            False; the same update, the rounding may differ).
        deterministic: deterministic algorithms only (with the CPU, runs and resumes are
            bit-identical); None (default): off for a new run, as the last segment ran for a resumed one.
        impl: the attention layers' training path (``"auto"``: the layers' own shape rule;
            ``"measure"``: timed on the run's own first layer before the first step, forgotten at
            exit, not under torchrun); None (default): the written rule's.
        eval_impl: the path of test passes (``"measure"`` as for ``impl``); None (default): the
            rule's where ``impl`` is not given, measured where it is ``"measure"``, else the training path.
        measure_compile: time the training step eager and compiled before the first step and compile
            where it pays back (default False); not with ``compile`` given, nor under torchrun.
        data_dir: cache folder of the official archives and decoded images (default None:
            ``$ATTNCNN_DATA_DIR`` or ``~/.cache/attncnn``).
        download: download official archives if missing (default False).

    Raises:
        ValueError (on construction): a precision not in :data:`~attncnn.runs.config.PRECISIONS`, a
            compile mode not in :data:`COMPILE_MODES`.
    """

    device: str = option("auto", help="auto (default), cpu, cuda, cuda:N: this machine's device (a run started on "
                                      "a GPU may resume on a CPU)")
    precision: str | None = option(None, choices=PRECISIONS,
                                   help="fp32, bf16 (mixed precision: bfloat16 matrix products, fp32 weights, "
                                        "softmax, LayerNorm and loss), or auto: bf16 where the device has bfloat16 "
                                        "units (CUDA with bf16, a CPU with AVX512-BF16 or AMX), else fp32 (default: "
                                        "auto; a resumed run: its own, fp32 where bf16 is slow)")
    compile: bool | None = option(None, help="torch.compile the model's training step (CPU inductor or CUDA); "
                                             "--no-compile never; unset (the default): the written rule "
                                             "(docs/speed.md: compiled only where measured faster on such a "
                                             "machine, and only for runs of at least ten minutes eager); never "
                                             "with --deterministic or under torchrun")
    compile_mode: str = option("default", choices=COMPILE_MODES,
                               help="how --compile compiles the step: default (torch.compile's default mode), or "
                                    "reduce-overhead (CUDA graphs: one launch per graph, for small models that are "
                                    "bound by kernel launches; CUDA only, implies --compile)")
    fused_optimizer: bool = option(False, help="update the weights with the optimizer's fused kernel (one kernel "
                                               "for all parameters) instead of its foreach kernels; the same "
                                               "recipe, rounded differently")
    deterministic: bool | None = option(None, help="deterministic algorithms only (with --device cpu, runs and "
                                                   "resumed runs are bit-identical; default: off, a resumed run as "
                                                   "its last segment ran)")
    impl: str | None = option(None, metavar="PATH",
                              help="attention computation path of training (auto: the layers' own shape rule; "
                                   "measure: time every path on the run's first layer before the first step, "
                                   "remembered by nothing; default: the written rule for the device, kind and "
                                   "grid, docs/speed.md)")
    eval_impl: str | None = option(None, metavar="PATH",
                                   help="attention computation path of test passes (measure: as for --impl; "
                                        "default: the rule's without --impl, else as --impl)")
    measure_compile: bool = option(False, help="time the training step eager and compiled on the run's own "
                                               "network before the first step and compile where it pays back "
                                               "(default: the written rule decides; not under torchrun)")
    data_dir: str | None = option(None, help="cache folder for official archives (default: $ATTNCNN_DATA_DIR or "
                                             "~/.cache/attncnn)")
    download: bool = option(False, help="download official archives if missing")

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in PRECISIONS:
            raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r} (--precision)")
        if self.compile_mode not in COMPILE_MODES:
            raise InputError(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {self.compile_mode!r} "
                             "(--compile-mode)")

    def paths(self) -> dict:
        """The attention paths given, as model options (``{"impl": ..., "eval_impl": ...}``, only those
        given by name: ``"measure"`` names none)."""
        return {k: v for k, v in (("impl", self.impl), ("eval_impl", self.eval_impl)) if v not in (None, "measure")}

    def flags(self) -> list[str]:
        """The command-line flags that give these options where they differ from the defaults (what
        an interrupted run's ``--resume`` command repeats; ``--download`` left out: the data is there)."""
        words: list[str] = []
        for field in dataclasses.fields(self):
            value, default = getattr(self, field.name), field.default
            if value == default or field.name == "download":
                continue
            flag = "--" + field.name.replace("_", "-")
            if isinstance(value, bool):
                words.append(flag if value else f"--no-{field.name.replace('_', '-')}")
            else:
                words += [flag, str(value)]
        return words
