"""The sample-efficiency grids: models x training-set sizes, equal seen images per cell, each declared
as one :class:`~.shapes.Grid` value (``efficiency``, ``efficiency-scarce``); the comment above each
declaration says what it asks and why it is shaped so.
"""

from __future__ import annotations

from .claims import SMALLEST, Claim, Criterion, Gain, Layers, PerRow, Scarcity, Versus
from .shapes import Grid

__all__ = ["EFFICIENCY", "EFFICIENCY_SCARCE", "OVERFITS"]

# ``efficiency``: the sample-efficiency grid, CPU-scale models x training-set sizes, equal seen images.
#
# ConViT (d'Ascoli et al., ICML 2021, Table 3) found that starting attention local helps most when
# data is scarce; this grid asks the same of the paper's layers at CPU scale. Every cell sees
# ``passes`` x 50,000 = 100,000 images (20, 8 and 2 epochs of 10 %, 25 % and 100 %), which must be a
# whole number of epochs of each subset: 25 %, not 30 % (multiples of 150,000 images, beyond the ~4
# hours the study was given on 2 cores). The 10 % cells, where the claims are, get a second seed
# (it changes both the initialisation and which 5,000 images are seen). The claims are reported with
# their numbers and no verdict: ``docs/study-efficiency.md`` judges them and gives the measured costs.
EFFICIENCY_ROWS = ("resnet18-mini", "quadratic-mini", "quadratic-conv-mini", "gpsa-mini", "learned-mini",
                   "learned-conv-mini")
#: every row but the ResNet
ATTENTION = tuple(row for row in EFFICIENCY_ROWS if row != "resnet18-mini")


def _conv_init_claims(random: str, conv: str) -> tuple[Claim, ...]:
    return (Claim(f"conv init helps ({conv})",
                  f"starting attention as a convolution helps most with little data ({conv} vs {random})",
                  "accuracy gain in points per training-set size", Gain(((conv, (random,)),))),
            Claim(f"conv init early ({conv})",
                  f"the gain of convolutional init is largest early in training ({conv} vs {random})",
                  "gain at the first evaluation vs after the last, per training-set size",
                  Gain(((conv, (random,)),), at=("first", "last"))))


EFFICIENCY_CLAIMS = (
    # every claim is about scarce data; it is only tested if the smallest subset is scarce at the
    # grid's budget, i.e. it costs accuracy (vs the largest) and the model fits it better than the
    # test set. An underfitted grid measures optimisation speed instead, whatever the subset size.
    Claim("scarce data", "precondition: the smallest subset is scarce data at this budget (it costs accuracy, "
                         "the model overfits it)",
          "per model, accuracy on {large} minus on {small}, and on {small} the last epoch's training accuracy "
          "(augmented images) minus the test accuracy, points", Scarcity()),
    *_conv_init_claims("quadratic-mini", "quadratic-conv-mini"),
    *_conv_init_claims("learned-mini", "learned-conv-mini"),
    Claim("gpsa beats random init", "GPSA (local init, gated content) beats random-init attention, most with "
                                    "little data",
          "gpsa-mini minus the better of quadratic-mini and learned-mini (of those finished), points",
          Gain((("gpsa-mini", ("quadratic-mini", "learned-mini")),))),
    Claim("gates", "GPSA's early layers stay positional, later layers turn to content (gates fall with depth)",
          "mean gate sigmoid(lambda) per layer after training (first seed)",
          Layers("gate", ("gpsa-mini",), seeds="first")),
    Claim("resnet", "a real convolution (ResNet) is still the most sample-efficient at this scale",
          "resnet18-mini minus the best attention model finished in the cell, points",
          Gain((("resnet18-mini", ATTENTION),))),
)

EFFICIENCY = Grid(
    name="efficiency",
    description=("sample efficiency: random vs convolutional init (quadratic, learned) vs GPSA vs ResNet on "
                 "10/25/100 % of the training set, 100,000 seen images per cell, seeds 0 and 1 on the 10 % cells"),
    rows={row: {} for row in EFFICIENCY_ROWS},
    fractions=(0.1, 0.25, 1.0),
    passes=2,
    more_seeds={0.1: (0, 1)},
    evaluations=4,
    gate_rows=("gpsa-mini",),
    recipe="SGD, warm-up 5 % + cosine over the cell's steps",
    claims=EFFICIENCY_CLAIMS,
)

# ``efficiency-scarce``: ConViT's claims where data is actually scarce, each with a verdict.
#
# ConViT (d'Ascoli et al., ICML 2021) claims that (a) GPSA beats a DeiT of the same size when data is
# scarce, by less as data grows; (b) the local (convolutional) init gives a head start early in
# training; (c) after training, the gates of the early layers stay positional while later layers
# turn to content. Each claim is judged by its criteria on the cells' numbers
# (:mod:`attncnn.reproduce.reporting.claims`), as is the precondition that the smallest cell is scarce
# data (the ResNet and the DeiT-style model end it at least 15 points above their test accuracy on
# their training images).
#
# The content models (DeiT-style, GPSA with ConViT's local init, GPSA without it: ConViT's ablation)
# train with AdamW at one shared rate, 1e-3, the choice of the three-point sweep on the 10 % cell by
# held-out accuracy (``results/efficiency-scarce/lr-sweep``); position-only models and the ResNet train
# with the paper's SGD. ``passes`` = 8 is the calibration's choice: at 8 the 10 % cell overfits by the
# criterion, at 4 it does not (:mod:`attncnn.reproduce.running.measurements`; the numbers are in
# ``docs/study-efficiency.md``). The 25 % cell is off by default (``--fractions 0.1,0.25,1``).
#
# ``deit-mini-mimetic`` is the DeiT-style baseline with mimetic initialisation (Trockman & Kolter,
# ICML 2023), the third way here of starting attention local, beside the quadratic layers' conv init
# (Theorem 1) and ConViT's local init; claim (d) sets the three gains side by side.
#: the content models' shared rate (the sweep's choice)
SHARED_LR = 1e-3
#: the smallest cell is scarce data when these rows overfit it
CALIBRATE_ROWS = ("resnet18-mini", "deit-mini")
#: by at least 15 points of train - test accuracy at its last epoch
OVERFITS = Criterion("gap", ">=", 0.15)
#: GPSA's two rows, with and without the local init
GATE_ROWS = ("convit-mini", "convit-mini-random")

SCARCE_CLAIMS = (
    Claim("scarce data", "precondition: the {small} cell is scarce data (the models overfit it)",
          "train - test accuracy at the end of the {small} cell (last epoch; mean over seeds), points; "
          f"needs >= {100 * OVERFITS.threshold:.0f} for {' and '.join(CALIBRATE_ROWS)}",
          PerRow("gap", CALIBRATE_ROWS), criteria=(OVERFITS,)),
    Claim("gpsa beats deit", "(a) GPSA beats DeiT with scarce data, and the gap shrinks with more data (convit-mini "
                             "vs deit-mini)",
          "final test accuracy, points; holds if convit-mini - deit-mini > 0 on {small} and larger on {small} than "
          "on {large}",
          Versus("convit-mini", "deit-mini"),
          criteria=(Criterion("difference", ">", 0.0, cell=SMALLEST), Criterion("shrink", ">", 0.0))),
    Claim("head start", "(b) local (conv) init gives a head start early in training",
          "test accuracy at the cell's first evaluation (and, for comparison, after the last), local init minus "
          "random init, points; holds if every first-evaluation difference is > 0",
          Gain((("convit-mini", ("convit-mini-random",)), ("quadratic-conv-mini", ("quadratic-mini",))),
               at=("first", "last")),
          criteria=(Criterion("first", ">", 0.0),)),
    Claim("three starts", "(d) three ways to start attention local: which starts ahead, which ends ahead",
          "test accuracy at the cell's first evaluation and after the last, each init minus the same model with "
          "random init, points: conv init (quadratic), ConViT's local init (GPSA), mimetic init (DeiT-style); "
          "holds if mimetic init's first-evaluation difference is > 0 in every cell",
          Gain((("quadratic-conv-mini", ("quadratic-mini",)), ("convit-mini", ("convit-mini-random",)),
                ("deit-mini-mimetic", ("deit-mini",))), at=("first", "last")),
          criteria=(Criterion("first", ">", 0.0, row="deit-mini-mimetic"),)),
    Claim("gates", "(c) gates: early layers stay positional, later layers turn to content",
          "mean gate sigmoid(lambda) per layer after the last epoch (mean over heads and seeds); holds if "
          "convit-mini's first layer is >= 0.5 (mostly positional) and its last layer < 0.5 (mostly content) in "
          "every cell",
          Layers("gate", GATE_ROWS),
          criteria=(Criterion("first layer", ">=", 0.5, row="convit-mini"),
                    Criterion("last layer", "<", 0.5, row="convit-mini"))),
)

EFFICIENCY_SCARCE = Grid(
    name="efficiency-scarce",
    description=("sample efficiency where data is scarce: DeiT-style content attention vs GPSA with and "
                 "without ConViT's local init (AdamW, one shared rate) vs quadratic attention with random and "
                 "conv init and the ResNet (SGD) on 10 and 100 % of the training set, equal seen images per cell "
                 "(chosen so that the 10 % cell overfits), seeds 0 and 1 on the 10 % cells"),
    # the content models share one AdamW rate (``--lr`` replaces it); the others keep their presets' recipe
    rows={"resnet18-mini": {}, "deit-mini": {"lr": SHARED_LR}, "convit-mini": {"lr": SHARED_LR},
          "convit-mini-random": {"preset": "convit-mini", "model": {"init": "random"}, "lr": SHARED_LR},
          "quadratic-mini": {}, "quadratic-conv-mini": {},
          "deit-mini-mimetic": {"preset": "deit-mini", "model": {"init": "mimetic"}, "lr": SHARED_LR}},
    fractions=(0.1, 1.0), passes=8, more_seeds={0.1: (0, 1)}, evaluations=8,
    notes={"convit-mini-random": "ConViT's ablation: convit-mini without local init (--set init=random: random "
                                 "positional vectors, random value projection)",
           "deit-mini-mimetic": "deit-mini with mimetic init (Trockman & Kolter 2023; --set init=mimetic): W_q W_k^T "
                                "near +0.7 I, W_v W_o near -0.4 I"},
    sweep_rows=("deit-mini", "convit-mini"),
    calibrate_rows=CALIBRATE_ROWS, overfit=OVERFITS, gate_rows=GATE_ROWS,
    recipe="AdamW at the grid's shared rate for the content models, SGD for the others; warm-up 5 % + cosine "
           "over the cell's steps",
    claims=SCARCE_CLAIMS,
)
