"""The sample-efficiency grid (issue 14): CPU-scale models x training-set sizes, equal seen images.

ConViT (d'Ascoli et al., ICML 2021, Table 3) found that starting attention local helps most when
data is scarce. This grid asks the same of the paper's layers at CPU scale: each model is trained
on class-balanced subsets of 10 %, 25 % and 100 % of the training set, every cell for the same
number of seen images (``passes`` times the full training set: 2 x 50,000 = 100,000 images on
CIFAR-10, i.e. 20, 8 and 2 epochs), with the preset's recipe (warm-up + cosine over the cell's
steps). The test set is evaluated about ``evaluations`` times per cell (accuracy against seen
images) and after the last epoch.

Why 25 % and not the issue's 30 %: every cell must be a whole number of epochs of the same seen
images, and with 30 % that means multiples of 150,000 images (30, 10, 3 epochs); at the 2-core
machine's speed (GPSA's content attention costs several times a position-only step) that grid
would take far more than the ~4 hours the issue allows, while 25 % fits 100,000.

A cell is an ordinary run folder ``<out>/<preset>/<pct>pct/seed<N>`` trained by the same resumable
runner as the Table 1 suites; its subset comes from the seed, so every model of a seed sees the
same images. The 10 % cells get a second seed by default (measured on a 2-core Intel Xeon: ~9 min
per position-only cell, ~2 min for the ResNet, ~30 min for GPSA): the claims are about them, and
a seed there changes both the initialisation and which 5,000 images are seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .suites import Job, select_presets

__all__ = ["Grid", "GRID", "cell_options", "plan_grid", "cell_name"]


@dataclass(frozen=True)
class Grid:
    """Models x training-set fractions, trained for equal seen images.

    Attributes:
        presets: the models, in training order within a fraction (the cheap baseline first).
        fractions: training-set fractions, smallest first (the cells ConViT's claim is about).
        passes: seen images per cell, in units of the full training set.
        seeds: default seeds (each seed draws its own subsets).
        more_seeds: fractions trained with more seeds than ``seeds`` by default: the scarce-data
            cells, where ConViT's claim lives and where one seed's subset varies most.
        evaluations: about how many test evaluations per cell.
        train_images: size of the full training set (CIFAR-10: 50,000).
    """

    name: str = "efficiency"
    description: str = ("sample efficiency, issue 14: random vs convolutional init (quadratic, learned) vs GPSA "
                        "vs ResNet on 10/25/100 % of the training set, 100,000 seen images per cell, seeds 0 "
                        "and 1 on the 10 % cells")
    presets: tuple[str, ...] = ("resnet18-mini", "quadratic-mini", "quadratic-conv-mini", "gpsa-mini",
                                "learned-mini", "learned-conv-mini")
    fractions: tuple[float, ...] = (0.1, 0.25, 1.0)
    passes: int = 2
    seeds: tuple[int, ...] = (0,)
    more_seeds: dict[float, tuple[int, ...]] = field(default_factory=lambda: {0.1: (0, 1)})
    evaluations: int = 4
    train_images: int = 50_000


    def seeds_of(self, fraction: float, seeds: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The seeds of ``fraction``'s cells: ``seeds`` when given, else the grid's defaults."""
        if seeds is not None:
            return seeds
        return self.more_seeds.get(fraction, self.seeds)


GRID = Grid()


def cell_name(fraction: float) -> str:
    """``0.1`` -> ``"10 %"`` (labels) ; folders use :func:`_folder_name`."""
    return f"{100 * fraction:g} %"


def _folder_name(fraction: float) -> str:
    return f"{100 * fraction:g}pct"


def cell_options(fraction: float, *, train_images: int, passes: int, evaluations: int) -> dict:
    """Training options of one cell: ``train_subset``, ``epochs``, ``eval_every``, ``checkpoint_every``.

    Raises:
        ValueError: the subset is empty, or the seen images (``passes * train_images``) are not a
            whole number of epochs of the subset (the message names a size that works).
    """
    subset = round(fraction * train_images)
    seen = passes * train_images
    if subset < 1 or subset > train_images:
        raise ValueError(f"{cell_name(fraction)} of {train_images} training images is {subset} images; "
                         "choose fractions in (0, 1] and a larger --train-images")
    if seen % subset:
        raise ValueError(f"{seen} seen images ({passes} passes of {train_images}) are not a whole number of epochs "
                         f"of {subset} images ({cell_name(fraction)} of {train_images}); choose --train-images and "
                         "--passes so that they are (the defaults, 50,000 and 2, give 20, 8 and 2 epochs)")
    epochs = seen // subset
    # no periodic checkpoints: a cell resumes from `last` (refreshed every epoch and every
    # checkpoint_every_steps) and ships `last` alone
    return {"train_subset": subset, "epochs": epochs, "eval_every": max(1, epochs // evaluations),
            "checkpoint_every": 0}


def plan_grid(grid: Grid, out: str | Path, *, seeds: tuple[int, ...] | None = None,
              only: tuple[str, ...] | None = None, train_images: int | None = None,
              passes: int | None = None) -> list[Job]:
    """The grid's jobs: per seed, the smallest fraction's cells first (every model), then larger.

    A grid run in parts thus has the scarce-data comparison, the one the claim is about, first,
    and the first seed's whole grid before any further seed (``Grid.more_seeds``).

    Args:
        out: the grid's folder; cells are ``<out>/<preset>/<pct>pct/seed<N>``.
        seeds: seeds of every cell (None: the grid's, :meth:`Grid.seeds_of`).
        only: restrict to these presets.
        train_images: the full training set's size (None: the grid's, CIFAR-10's 50,000).
        passes: seen images per cell in full training sets (None: the grid's).

    Raises:
        ValueError: a preset in ``only`` that is not in the grid, a cell that is not a whole number
            of epochs (see :func:`cell_options`), ``passes`` < 1.
    """
    presets = select_presets(grid.presets, only, f"the {grid.name} grid")
    passes = grid.passes if passes is None else passes
    if passes < 1:
        raise ValueError(f"--passes must be >= 1, got {passes}")
    train_images = train_images or grid.train_images
    cells = {f: cell_options(f, train_images=train_images, passes=passes, evaluations=grid.evaluations)
             for f in grid.fractions}
    per_fraction = {f: grid.seeds_of(f, seeds) for f in grid.fractions}
    all_seeds = dict.fromkeys(s for f in grid.fractions for s in per_fraction[f])
    return [Job(preset, seed, Path(out) / preset / _folder_name(fraction) / f"seed{seed}",
                tuple(sorted(cells[fraction].items())), cell_name(fraction))
            for seed in all_seeds for fraction in grid.fractions if seed in per_fraction[fraction]
            for preset in presets]
