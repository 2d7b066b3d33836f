"""``attncnn reproduce STUDY``: train a study (resumable), then write its report, figures and viewer
page; or ``--dry-run``, ``--report-only``, a grid's ``--calibrate`` and ``--lr-sweep``. The flags
become a :class:`~attncnn.reproduce.request.StudyRequest` (rules in
:data:`attncnn.reproduce.request.RULES`) for :func:`attncnn.reproduce.orchestration.run_study`.
"""

from __future__ import annotations

import argparse

from ..reproduce.orchestration import VIEWER_AVERAGE, VIEWER_IMAGES
from ..reproduce.studies import EFFICIENCY, EFFICIENCY_SCARCE, GRIDS, STUDIES, SUITES
from ..runs.config import PRECISIONS

__all__ = ["register", "handle"]


def register(sub) -> None:
    studies = "\n".join(f"  {s.name}: {s.description}" for s in [*SUITES.values(), *GRIDS.values()])
    r = sub.add_parser(
        "reproduce", help="train a study (resumable) and write its report, figures and viewer page",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train every run of a study in sequence into <out>/<preset>/seed<N> (ordinary run folders), "
                    "skipping finished runs and\nresuming interrupted ones (stop it at any time: the same command "
                    "continues), then write <out>/report.md,\n<out>/figures/ and, for a suite, <out>/viewer.html. "
                    "--dry-run estimates this machine's time.\n\nstudies:\n" + studies)
    r.add_argument("suite", choices=sorted(STUDIES))
    r.add_argument("--data", help="cifar10 (default) or an image folder/zip, as for `train`; for the report's "
                                   "test images: default each run's own")
    r.add_argument("--data-dir", help="cache folder for official archives")
    r.add_argument("--download", action="store_true", help="download official archives if missing")
    r.add_argument("--out", help="suite folder (default: results/<suite>)")
    r.add_argument("--seeds", help="comma-separated seeds for every model (default: each study's: "
                                   + "; ".join(map(_default_seeds, STUDIES.values())) + ")")
    r.add_argument("--only", help="comma-separated presets of the suite (rows of a grid, or of its --calibrate or "
                                  "--lr-sweep) to train (the report still covers every finished run under --out, "
                                  "so a suite run in parts keeps one report)")
    r.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N")
    r.add_argument("--precision", choices=PRECISIONS,
                   help="training precision of new runs and of resumed ones (default: the preset's, auto, for a new "
                        "run; a resumed run's own, but fp32 for a bf16 run on a device without fast bf16)")
    r.add_argument("--compile", action=argparse.BooleanOptionalAction,
                   help="torch.compile the training step of new runs and of resumed ones (a machine's choice: "
                        "each epoch record says whether a compiled step trained it); --no-compile never "
                        "(default: this machine's measured choice, for a resumed run too)")
    r.add_argument("--epochs", type=int, help="override every model's epochs (smoke runs; the report shows it)")
    r.add_argument("--train-subset", type=int, metavar="N", help="train on N images (smoke runs)")
    r.add_argument("--batch-size", type=int, help="override every model's batch size (smoke runs on tiny data)")
    efficiency, scarce = EFFICIENCY, EFFICIENCY_SCARCE          # the grids whose defaults the help names
    r.add_argument("--train-images", type=int, metavar="N",
                   help=f"{efficiency.name}: size of the full training set, the 100 %% cell (default "
                        f"{efficiency.train_images:,}, CIFAR-10's)")
    r.add_argument("--passes", type=int, help=f"grids: seen images per cell in full training sets "
                                              f"(default {efficiency.name} {efficiency.passes}, {scarce.name} "
                                              f"{scarce.passes})")
    r.add_argument("--fractions", metavar="F,G,...",
                   help=f"grids: the training-set fractions of the cells (default {efficiency.name} "
                        f"{','.join(f'{f:g}' for f in efficiency.fractions)}, {scarce.name} "
                        f"{','.join(f'{f:g}' for f in scarce.fractions)}; e.g. 0.1,0.25,1 adds the 25 %% cell); "
                        "--calibrate and --lr-sweep train the smallest")
    shared = {row: recipe["lr"] for row, recipe in scarce.rows.items() if "lr" in recipe}
    r.add_argument("--lr", type=float, metavar="RATE",
                   help=f"{scarce.name}: the learning rate shared by its content models "
                        f"({', '.join(shared)}; default {next(iter(shared.values())):g})")
    r.add_argument("--calibrate", action="store_true",
                   help=f"{scarce.name}: train {' and '.join(scarce.calibrate_rows)} on the 10 %% cell "
                        "(seed 0) for --passes into <out>/calibrate/passes<P>/ and print their train - test gap "
                        "beside the criterion (>= 15 points)")
    r.add_argument("--lr-sweep", metavar="R,S,...",
                   help=f"{scarce.name}: train {' and '.join(scarce.sweep_rows)} on the 10 %% cell (seed "
                        "0) at each rate (e.g. 2.5e-4,5e-4,1e-3) into <out>/lr-sweep/ and report the best rate for "
                        "both")
    does = r.add_argument_group("what this call does", "one of them at most; none: train what is left, then "
                                "report")
    does.add_argument("--dry-run", action="store_true",
                   help="print each job's train command and its time estimated from a short measurement here")
    does.add_argument("--report-only", action="store_true", help="train nothing; report what has finished")
    r.add_argument("--no-viewer", action="store_true", help="skip the viewer page")
    r.add_argument("--viewer-images", default=",".join(map(str, VIEWER_IMAGES)), metavar="I,J,...",
                   help="test images of the viewer page (default %(default)s; each costs a content model 3-5 MB "
                        "of page at width 64, position-only models nothing; the paper's site shows 2,3,19,56)")
    r.add_argument("--viewer-average", type=int, default=VIEWER_AVERAGE, metavar="N",
                   help="test images averaged in the viewer page's 'average' entry of content models (default "
                        "%(default)s: none, ~8 MB at width 64 for 100; paper Fig. 6's average is in figures/)")
    r.add_argument("--formats", default="png", help="figure formats, comma-separated (default png)")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    r.set_defaults(handler=handle)


def _default_seeds(study) -> str:
    """``"mini 0, 0,1,2 for quadratic-mini and learned-mini"``: a study's declared seeds, for the help."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for key, seeds in study.more_seeds.items():         # a suite's presets, a grid's training-set fractions
        groups.setdefault(seeds, []).append(key if isinstance(key, str) else f"the {100 * key:g} %% cells")
    return f"{study.name} {','.join(map(str, study.seeds))}" + "".join(
        f", {','.join(map(str, seeds))} for {' and '.join(keys)}" for seeds, keys in groups.items())


def handle(args: argparse.Namespace) -> int:
    from ..reproduce.orchestration import run_study
    from ..reproduce.request import StudyRequest, one_of

    action = one_of([name for name in ("dry-run", "report-only") if getattr(args, name.replace("-", "_"))],
                    "action")
    measurement = one_of([name for name, given in (("calibrate", args.calibrate), ("lr-sweep", args.lr_sweep))
                          if given], "measurement")
    run_study(StudyRequest(
        study=args.suite, action=action or "train", measurement=measurement, rates=args.lr_sweep, out=args.out,
        data=args.data, data_dir=args.data_dir, download=args.download, device=args.device, precision=args.precision,
        compile=args.compile, epochs=args.epochs, train_subset=args.train_subset, batch_size=args.batch_size,
        seeds=args.seeds, only=args.only, train_images=args.train_images, passes=args.passes,
        fractions=args.fractions, lr=args.lr, viewer=not args.no_viewer, viewer_images=args.viewer_images,
        viewer_average=args.viewer_average, formats=args.formats, progress=not args.no_progress,
        command=getattr(args, "command_line", None)))
    return 0
