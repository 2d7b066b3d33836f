"""``efficiency``: the sample-efficiency grid, CPU-scale models x training-set sizes, equal seen images.

ConViT (d'Ascoli et al., ICML 2021, Table 3) found that starting attention local helps most when
data is scarce. This grid asks the same of the paper's layers at CPU scale: each model is trained
on class-balanced subsets of 10 %, 25 % and 100 % of the training set, every cell for the same
number of seen images (``passes`` times the full training set: 2 x 50,000 = 100,000 images on
CIFAR-10, i.e. 20, 8 and 2 epochs), with the preset's recipe (warm-up + cosine over the cell's
steps). The test set is evaluated about ``evaluations`` times per cell (accuracy against seen
images) and after the last epoch.

Why 25 % and not 30 %: every cell must be a whole number of epochs of the same seen images, and
with 30 % that means multiples of 150,000 images (30, 10, 3 epochs); at the 2-core machine's speed
(GPSA's content attention costs several times a position-only step) that grid would take far more
than the ~4 hours the study was given, while 25 % fits 100,000.

The 10 % cells get a second seed by default (measured on a 2-core Intel Xeon: ~9 min per
position-only cell, ~2 min for the ResNet, ~30 min for GPSA): the claims are about them, and a seed
there changes both the initialisation and which 5,000 images are seen. The claims are reported with
their numbers and no verdict: ``docs/study-efficiency.md`` judges them.
"""

from __future__ import annotations

from .claims import Claim, Gain, Layers, Scarcity
from .shapes import Grid

__all__ = ["EFFICIENCY"]

ROWS = ("resnet18-mini", "quadratic-mini", "quadratic-conv-mini", "gpsa-mini", "learned-mini", "learned-conv-mini")
#: every row but the ResNet
ATTENTION = tuple(row for row in ROWS if row != "resnet18-mini")


def _conv_init_claims(random: str, conv: str) -> tuple[Claim, ...]:
    return (Claim(f"conv init helps ({conv})",
                  f"starting attention as a convolution helps most with little data ({conv} vs {random})",
                  "accuracy gain in points per training-set size", Gain(((conv, (random,)),))),
            Claim(f"conv init early ({conv})",
                  f"the gain of convolutional init is largest early in training ({conv} vs {random})",
                  "gain at the first evaluation vs after the last, per training-set size",
                  Gain(((conv, (random,)),), at=("first", "last"))))


CLAIMS = (
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
    presets=ROWS,
    fractions=(0.1, 0.25, 1.0),
    passes=2,
    more_seeds={0.1: (0, 1)},
    evaluations=4,
    gate_rows=("gpsa-mini",),
    recipe="SGD, warm-up 5 % + cosine over the cell's steps",
    claims=CLAIMS,
)
