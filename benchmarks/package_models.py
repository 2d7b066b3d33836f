"""The trained models that come with the installed package, made from ``results/`` (never by hand).

Two things in ``src/attncnn/pretrained_models/`` are written here:

* the five 60-epoch mini models (seed 0 of ``results/mini-long``), each as a trimmed run folder at
  the same place under ``pretrained_models/`` as under ``results/``
  (``mini-long/quadratic-mini/seed0/``): ``config.json`` and ``machine.json`` as the run wrote
  them, a short ``finished.json`` (epochs, recorded accuracy, where it came from, the weights'
  dtype) and ``checkpoints/last.safetensors``: the run's final weights rounded to the dtype chosen
  in :data:`PACKAGED`, with the checkpoint's metadata and without its random-number states;
* ``downloads.json``: the sha256 and size of every file of the width-400 models of
  ``results/paper-long`` (:data:`DOWNLOADS`), which ``attncnn download`` checks each file against.

Usage (from the repository root)::

    python benchmarks/package_models.py                  # write them
    python benchmarks/package_models.py --check          # exit status 1 if they differ from results/
    python benchmarks/package_models.py --evaluate --data /path/to/cifar10-jpeg.zip
        # test accuracy with float32 and bfloat16 weights (float32 compute, all 10,000 test images),
        # written to benchmarks/results/packaged-models-<machine>-<date>.md

tests/benchmarks/test_package_models.py regenerates them into a temporary folder and compares.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
PACKAGE = REPO / "src" / "attncnn" / "pretrained_models"
MANIFEST = "downloads.json"

#: packaged model -> weights dtype: bfloat16 where its test accuracy with rounded weights (float32
#: compute, all 10,000 test images) is within 0.1 points of the run's recorded one
#: (benchmarks/results/packaged-models-amd-epyc-2cores-2026-11-29.md), else float32
PACKAGED = {
    "quadratic-mini": "bf16",
    "quadratic-generalized-mini": "bf16",
    "learned-mini": "bf16",
    "learned-content-mini": "bf16",
    "resnet18-mini": "bf16",
}
PACKAGED_SUITE, SEED = "mini-long", 0
#: the width-400 models of results/paper-long that ``attncnn download`` fetches by name
DOWNLOADS = ("quadratic", "quadratic-generalized", "learned", "resnet18")
DOWNLOAD_SUITE = "paper-long"
#: the files of a run folder a download copies (what loading, evaluating and checking a run read)
DOWNLOAD_FILES = ("config.json", "finished.json", "machine.json", "predictions.json", "checkpoints/last.safetensors")
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def run_folder(results: Path, suite: str, name: str) -> Path:
    return results / suite / name / f"seed{SEED}"


def rounded_state(state: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """``state`` with every floating tensor rounded to ``dtype`` (integer buffers kept)."""
    target = _DTYPES[dtype]
    return {k: t.to(target) if t.is_floating_point() else t for k, t in state.items()}


def _finished(run: Path, dtype: str) -> dict:
    """The short ``finished.json`` of a packaged model: what :func:`attncnn.pretrained` and a reader need."""
    full = json.loads((run / "finished.json").read_text())
    final = full["final"]
    return {"epochs": full["epochs"], "preset": full["preset"], "parameters": full["parameters"],
            "dataset": full["dataset"], "best": full["best"],
            "final": {key: final[key] for key in ("epoch", "test_accuracy", "test_loss", "train_accuracy",
                                                  "train_loss") if key in final},
            "packaged": {"from": "results/" + run.relative_to(run.parents[2]).as_posix(), "weights_dtype": dtype,
                         "note": "final weights of the run rounded to weights_dtype; load them with "
                                 "attncnn.pretrained(preset) or any command that takes a run folder"}}


def _canonical_header(path: Path) -> None:
    """Put the ``__metadata__`` entries of a safetensors file in name order: the library writes them
    in an order that changes from one run to the next, so the same weights would give other bytes
    each time. Same length, same contents (the digests do not depend on the order)."""
    with open(path, "r+b") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size).decode("utf-8"))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) > size:
            raise RuntimeError(f"{path}: the reordered header is longer than the original ({len(text)} > {size})")
        f.seek(8)
        f.write(text + b" " * (size - len(text)))


def write_packaged(results: Path, out: Path, dtypes: dict[str, str] | None = None) -> list[Path]:
    """Write the packaged mini models from ``results`` into ``out`` (a fresh folder per model);
    returns their run folders."""
    from attncnn._io import atomic_write_text
    from attncnn.runs.checkpoint import Checkpoint, load_checkpoint, write_checkpoint

    folders = []
    for name, dtype in (dtypes or PACKAGED).items():
        run = run_folder(results, PACKAGED_SUITE, name)
        target = run_folder(out, PACKAGED_SUITE, name)
        if target.exists():
            shutil.rmtree(target)
        (target / "checkpoints").mkdir(parents=True)
        for file in ("config.json", "machine.json"):
            shutil.copyfile(run / file, target / file)
        atomic_write_text(target / "finished.json", json.dumps(_finished(run, dtype), indent=1) + "\n")
        source = load_checkpoint(run / "checkpoints" / "last.safetensors")
        write_checkpoint(target / "checkpoints" / "last.safetensors",
                         Checkpoint(model_state=rounded_state(source.model_state, dtype), optimizer_state=None,
                                    metadata=source.metadata))
        _canonical_header(target / "checkpoints" / "last.safetensors")
        folders.append(target)
    return folders



def manifest(results: Path) -> dict:
    """The download manifest: per model name, its run folder under ``results/`` and each file's size and sha256."""
    from attncnn._io import file_sha256

    models = {}
    for name in DOWNLOADS:
        run = run_folder(results, DOWNLOAD_SUITE, name)
        finished = json.loads((run / "finished.json").read_text())
        models[name] = {"path": run.relative_to(results).as_posix(), "seed": SEED, "epochs": finished["epochs"],
                        "parameters": finished["parameters"], "test_accuracy": finished["final"]["test_accuracy"],
                        "files": {file: {"bytes": (run / file).stat().st_size, "sha256": file_sha256(run / file)}
                                  for file in DOWNLOAD_FILES}}
    return {"format": 1, "about": "files of the trained models `attncnn download NAME --from URL_OR_FOLDER` "
                                  "fetches, at PATH/FILE under the source; written by benchmarks/package_models.py "
                                  "from results/", "models": models}


def write_all(results: Path, package: Path) -> None:
    from attncnn._io import atomic_write_text

    write_packaged(results, package)
    atomic_write_text(package / MANIFEST, json.dumps(manifest(results), indent=1) + "\n")


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and (p.suffix in (".json", ".safetensors"))}


def differences(results: Path, package: Path) -> list[str]:
    """Files of ``package`` that regenerating from ``results`` would change, add or remove."""
    with tempfile.TemporaryDirectory() as tmp:
        write_all(results, Path(tmp))
        want, have = _tree(Path(tmp)), _tree(package)
    return sorted(name for name in want.keys() | have.keys() if want.get(name) != have.get(name))


def evaluate_dtypes(results: Path, data: str, done: Path | None = None) -> list[dict]:
    """Test accuracy of each packaged model with float32 and with bfloat16 weights, float32 compute.

    ``done``: a JSON-lines file of rows already measured (kept across an interrupted run: a full
    pass of a content model takes minutes on two shared cores); each new row is appended to it."""
    from attncnn.data import DeviceLoader, load_dataset
    from attncnn.perf.host_memory import reuse_freed_memory
    from attncnn.runs import load_model
    from attncnn.training import evaluate

    reuse_freed_memory()              # as `attncnn evaluate` does: batches of 500 without page faults
    rows = [json.loads(line) for line in done.read_text().splitlines()] if done and done.exists() else []
    dataset = None
    with tempfile.TemporaryDirectory() as tmp:
        for name in PACKAGED:
            for dtype in ("fp32", "bf16"):
                if any(r["model"] == name and r["weights"] == dtype for r in rows):
                    continue
                dataset = dataset or load_dataset(data)
                folder, = write_packaged(results, Path(tmp) / dtype, {name: dtype})
                model, _ = load_model(folder)
                loader = DeviceLoader(dataset.test, batch_size=500, device="cpu", train=False)
                result = evaluate(model, loader, precision="fp32")
                recorded = json.loads((folder / "finished.json").read_text())["final"]["test_accuracy"]
                rows.append({"model": name, "weights": dtype, "accuracy": result.accuracy, "recorded": recorded,
                             "examples": result.examples, "seconds": result.seconds})
                print(rows[-1], flush=True)
                if done:
                    with open(done, "a") as f:
                        f.write(json.dumps(rows[-1]) + "\n")
    order = {name: i for i, name in enumerate(PACKAGED)}
    return sorted(rows, key=lambda r: (order[r["model"]], r["weights"] != "fp32"))


def _report(rows: list[dict], data: str) -> str:
    import platform

    lines = [f"# Packaged mini models: test accuracy of float32 and bfloat16 weights ({datetime.date.today()})", "",
             "Seed 0 of `results/mini-long` (60 epochs), final weights; every model evaluated on all 10,000 test "
             f"images of {Path(data).name} (the data they were trained on), float32 compute, batch 500, on a "
             "2-core AMD EPYC (AVX2 only, no AVX512-BF16) shared with other work; torch "
             f"{torch.__version__}, Python {platform.python_version()}. Recorded: the run's own final test "
             "accuracy (`finished.json`, measured during training in its own precision).",
             "", "| model | weights | accuracy (%) | recorded (%) | difference (points) | images |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['weights']} | {100 * r['accuracy']:.2f} | {100 * r['recorded']:.2f} | "
                     f"{100 * (r['accuracy'] - r['recorded']):+.2f} | {r['examples']:,} |")
    chosen = {r["model"]: r["weights"] for r in rows
              if r["weights"] == "bf16" and abs(r["accuracy"] - r["recorded"]) <= 0.001 + 1e-9}
    lines += ["", "Rule: a model is packaged with bfloat16 weights when they are within 0.1 points of the recorded "
              "accuracy, else float32 (`PACKAGED` in `benchmarks/package_models.py`). Result: "
              + ", ".join(f"{m} {chosen.get(m, 'fp32')}" for m in PACKAGED) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--package", type=Path, default=PACKAGE)
    parser.add_argument("--check", action="store_true", help="only compare; exit status 1 on a difference")
    parser.add_argument("--evaluate", action="store_true", help="measure float32 against bfloat16 weights")
    parser.add_argument("--data", help="the CIFAR-10 zip the runs trained on (for --evaluate)")
    parser.add_argument("--out", type=Path, help="the --evaluate report (default: benchmarks/results/...)")
    parser.add_argument("--done", type=Path, help="--evaluate: JSON lines of rows measured already (read, appended)")
    args = parser.parse_args(argv)
    if args.evaluate:
        if not args.data:
            parser.error("--evaluate needs --data")
        rows = evaluate_dtypes(args.results, args.data, args.done)
        name = f"packaged-models-amd-epyc-2cores-{datetime.date.today()}.md"
        out = args.out or REPO / "benchmarks" / "results" / name
        out.write_text(_report(rows, args.data))
        print(out)
        return 0
    if args.check:
        changed = differences(args.results, args.package)
        print("\n".join(changed) or "the packaged models match results/")
        return 1 if changed else 0
    write_all(args.results, args.package)
    print(f"wrote {args.package}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
