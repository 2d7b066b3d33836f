"""Ready a study's folder for ``git add``: ``python tools/ship.py results/<study> [options]``.

Not part of the package: how this project carries its runs between machines and into the
repository. In the study's folder (``results/<study>``, or any ``--out`` of ``attncnn reproduce``
with ``--study``), every run folder found (a study's runs, a grid's measurement runs, a pruned
model's fine-tune beside them) is

* trimmed when it has finished (:func:`trim.trim_run`: final weights, records, no local paths;
  a grid's cells leanly, the periodic checkpoints kept, as weights, for the run a suite draws
  over its epochs, paper Fig. 3);
* reduced to what resuming it needs when it is unfinished (:func:`unfinished.ship_unfinished`:
  its newest checkpoint with the optimiser state); ``--finished-only`` leaves such runs alone
  (e.g. while they train);
* with ``--without-weights PRESET,...``, a finished run of those presets ships its records alone
  (:func:`withhold.withhold_jobs`: its weights move to ``--weights-to``, outside the clone).

Then ``attncnn reproduce <study> --report-only`` writes the report of what has finished (unless
``--no-report``). The same ``attncnn reproduce <study> --data <data set>`` resumes an unfinished
run, here or from a fresh clone. Exit status 2 with one line on stderr for a user error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

__all__ = ["run_folders", "evolution_folder", "ship_study", "main"]


def run_folders(folder: Path) -> list[Path]:
    """Every run folder (one with ``config.json``) under ``folder``, sorted."""
    return sorted(config.parent for config in folder.rglob("config.json") if config.parent.name != "checkpoints")


def evolution_folder(study, folder: Path) -> Path | None:
    """The run whose periodic checkpoints a suite's figure of the centres over the epochs (paper
    Fig. 3) is drawn from: its evolution preset's lowest seed under ``folder``. None for a grid or
    a suite that draws it from the epochs' records."""
    from attncnn.reproduce import Grid
    if isinstance(study, Grid) or study.evolution_from != "checkpoints":
        return None
    seeds = sorted(int(p.name.removeprefix("seed")) for p in (folder / study.evolution_preset).glob("seed*")
                   if p.name.removeprefix("seed").isdigit())
    return folder / study.evolution_preset / f"seed{seeds[0]}" if seeds else None


def _on_disk_jobs(study, folder: Path) -> list:
    """The study's jobs whose folders exist under ``folder``, for every seed found there."""
    from attncnn.reproduce import plan_study
    seeds = {int(p.name.removeprefix("seed")) for p in folder.glob("*/seed*") if p.name.removeprefix("seed").isdigit()}
    seeds |= {int(p.name.removeprefix("seed")) for p in folder.glob("*/*/seed*")
              if p.name.removeprefix("seed").isdigit()}     # a grid's cells: <row>/<cell>/seed<N>
    if not seeds:
        return []
    return [job for job in plan_study(study, folder, seeds=tuple(sorted(seeds))) if job.folder.is_dir()]


def ship_study(study, folder: Path, *, finished_only: bool = False, without_weights: str | None = None,
               weights_to: str | None = None, data: str | None = None, data_dir: str | None = None) -> list[str]:
    """Trim the finished runs under ``folder``, withhold the weights of ``without_weights``'s
    presets, and (unless ``finished_only``) ship the unfinished ones; returns a line per run.

    Raises:
        InputError: an unknown preset in ``without_weights``, a finished run to withhold without its
            prediction record, an unfinished run that cannot be resumed.
        RunFolderError: a process is training an unfinished run now (stop it first).
    """
    from trim import trim_run
    from unfinished import ship_unfinished
    from withhold import presets_named, withhold_jobs

    from attncnn.reproduce import Grid
    presets = presets_named(study, without_weights, "--without-weights") if without_weights else []
    keep = evolution_folder(study, folder)
    runs = run_folders(folder)
    lines = []
    for run in runs:
        if (run / "finished.json").is_file():
            before, after = trim_run(run, keep_epochs=run == keep, lean=isinstance(study, Grid))
            lines.append(f"finished {run}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    if presets:
        done = withhold_jobs(study, folder, _on_disk_jobs(study, folder), presets, weights_to=weights_to,
                             data=data, data_dir=data_dir)
        for job, record, where in done:
            lines.append(f"{job.label}: shipped without its weights ({record['bytes'] / 1e6:.1f} MB, sha256 "
                         f"{record['sha256'][:16]}...); they are in {where}, outside what is committed")
    for run in runs if not finished_only else []:
        if not (run / "finished.json").is_file():
            before, after = ship_unfinished(run, keep_epochs=run == keep)
            lines.append(f"unfinished {run}: ready to commit ({before / 1e6:.1f} MB -> {after / 1e6:.1f} MB, "
                         "resumable)")
    return lines


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python tools/ship.py", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="the study's folder, e.g. results/mini-long")
    p.add_argument("--study", help="the study it holds (default: the folder's name)")
    p.add_argument("--finished-only", action="store_true", help="trim finished runs; leave unfinished ones alone")
    p.add_argument("--without-weights", metavar="PRESET,...",
                   help="ship the finished runs of these presets without their weights (records, prediction "
                        "record and attention per layer stay; weights-withheld.json says what the weights were)")
    p.add_argument("--weights-to", metavar="DIR", help="with --without-weights: where the weights go, as "
                   "<DIR>/<preset>/seed<N>/checkpoints (default: withheld-weights/<study>)")
    p.add_argument("--data", help="the test images of the attention per layer and of the report (default: each "
                                  "run's own data set)")
    p.add_argument("--data-dir", help="cache folder for official archives")
    p.add_argument("--seeds", help="comma-separated seeds the study was trained with, as given to `attncnn "
                                   "reproduce` (default: the study's), so that the report does not list others as "
                                   "missing")
    p.add_argument("--epochs", type=int, help="the --epochs the study was trained with, if one was given")
    p.add_argument("--no-report", action="store_true", help="write no report afterwards")
    p.add_argument("--no-viewer", action="store_true", help="the report without the viewer page")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from attncnn.errors import AttncnnError, InputError
    from attncnn.reproduce import STUDIES, StudyRequest, run_study
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    folder = Path(args.folder)
    name = args.study or folder.name
    try:
        if name not in STUDIES:
            raise InputError(f"{folder} is no study's folder by its name; give --study ({', '.join(sorted(STUDIES))})")
        if args.weights_to and not args.without_weights:
            raise InputError("--weights-to is where --without-weights moves the weights; give both or neither")
        if not folder.is_dir():
            raise InputError(f"{folder} is not a folder")
        for line in ship_study(STUDIES[name], folder, finished_only=args.finished_only,
                               without_weights=args.without_weights, weights_to=args.weights_to, data=args.data,
                               data_dir=args.data_dir):
            print(line)
        if args.no_report:
            return 0
        if not any((run / "finished.json").is_file() for run in run_folders(folder)):
            print(f"no finished run under {folder} yet, so no report; the unfinished runs are ready for "
                  f"`git add {folder}`")
            return 0
        run_study(StudyRequest(name, action="report-only", out=str(folder), data=args.data, data_dir=args.data_dir,
                               seeds=args.seeds, epochs=args.epochs, viewer=not args.no_viewer, progress=False))
    except AttncnnError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    # run from a checkout: the package's own src/ first, as the tools' tests import it
    sys.path[1:1] = [str(Path(__file__).resolve().parents[1] / "src")]
    sys.exit(main())
