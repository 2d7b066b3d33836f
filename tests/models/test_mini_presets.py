"""The CPU-scale presets of the reproduction suite: exact parameter counts derived by hand."""

import pytest
import torch

from attncnn.models import build_model, count_parameters, get_preset

D, HEADS, LAYERS, MLP, CLASSES, TOKENS_IN = 64, 9, 6, 128, 10, 12      # width 64, 2x2 space-to-depth
# Outside attention, per layer (PAPER.md 5.2 at width 64): dense D->D, two LayerNorms, MLP D->128->D.
BLOCK = (D * D + D) + 2 * (2 * D) + (D * MLP + MLP) + (MLP * D + D)
EDGES = (TOKENS_IN * D + D) + (D * CLASSES + CLASSES)                 # embedding + classifier
VALUES = HEADS * D * D + D                                             # per-head value-output fold, one bias
TABLE_ROWS = 2 * 16 - 1                                                # relative offsets -15..15 per axis


def transformer(attention_params: int) -> int:
    return EDGES + LAYERS * (BLOCK + VALUES + attention_params)


MINI_COUNTS = {
    "quadratic-mini": transformer(HEADS * 2 + HEADS),                  # centres + one spread per head
    "quadratic-generalized-mini": transformer(HEADS * 2 + HEADS * 4),  # centres + 2x2 matrix per head
    "learned-mini": transformer(2 * TABLE_ROWS * D + 2 * D * HEADS),   # 64-d tables + head keys per axis
    # q and k (D -> 9 x 64 with bias) and 32-d tables per axis (half the head width each)
    "learned-content-mini": transformer(2 * (D * HEADS * D + HEADS * D) + 2 * TABLE_ROWS * (D // 2)),
    # q and k as above, 64-d tables and head keys per axis (the reference's 9ffaa30 form)
    "learned-content-9ffaa-mini": transformer(2 * (D * HEADS * D + HEADS * D) + 2 * TABLE_ROWS * D + 2 * D * HEADS),
}


def resnet(widths=(11, 22, 44, 88), classes=10) -> int:
    conv_bn = lambda cin, cout, k: cin * cout * k * k + 2 * cout          # noqa: E731 (conv, no bias) + BN
    total, cin = conv_bn(3, widths[0], 3), widths[0]
    for stage, width in enumerate(widths):
        for block in range(2):
            total += conv_bn(cin, width, 3) + conv_bn(width, width, 3)
            if cin != width:
                total += conv_bn(cin, width, 1)
            cin = width
    return total + cin * classes + classes


@pytest.mark.parametrize("name,count", [*MINI_COUNTS.items(), ("resnet18-mini", resnet())])
def test_mini_parameter_counts(name, count):
    assert count_parameters(build_model(name)) == count


def test_hand_counts_agree_with_the_paper_scale_formula():
    # the same formulas at the paper's widths give PAPER.md's counts, and the paper presets have them
    d = 400
    block = (d * d + d) + 4 * d + (d * 512 + 512) + (512 * d + d)
    quadratic = (12 * d + d) + (d * 10 + 10) + 6 * (block + HEADS * d * d + d + 27)
    with torch.device("meta"):             # counted, never allocated
        assert quadratic == 12_086_844 == count_parameters(build_model("quadratic"))
        # learned + content, 9ffaa30 form: q and k (D -> 9 D, with bias), 400-d tables and head keys per axis
        keyed = quadratic - 6 * 27 + 6 * (2 * (d * HEADS * d + HEADS * d) + 2 * TABLE_ROWS * d + 2 * d * HEADS)
        assert keyed == 29_601_882 == count_parameters(build_model("learned-content-9ffaa"))
        assert resnet((64, 128, 256, 512)) == 11_173_962 == count_parameters(build_model("resnet18"))


@pytest.mark.parametrize("name", list(MINI_COUNTS) + ["resnet18-mini"])
def test_mini_presets_share_the_recipe_shape_of_the_paper(name):
    train = get_preset(name).train
    assert (train["batch_size"], train["lr"], train["momentum"], train["weight_decay"]) == (100, 0.1, 0.9, 1e-4)
    assert (train["schedule"], train["warmup_ratio"], train["epochs"]) == ("cosine", 0.05, 6)
    if name != "resnet18-mini":
        model = get_preset(name).model
        assert (model["num_layers"], model["num_heads"], model["pooling"], model["dim"]) == (6, 9, 2, 64)
