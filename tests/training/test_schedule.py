"""LR schedule: exact values from PAPER.md section 4 (cosine) and section 3.7 (multistep)."""

import math

import pytest
import torch

from attncnn.training.schedule import LRSchedule, warmup_cosine_multiplier


def reference_schedule(**kw) -> LRSchedule:
    args = dict(base_lr=0.1, epochs=300, steps_per_epoch=500, stepping="epoch", num_train_examples=50000,
                batch_size=100)
    args.update(kw)
    return LRSchedule(**args)


def test_reference_totals():
    s = reference_schedule()
    assert s.total_steps == 150300
    assert s.warmup_steps == 7515


# (epoch, expected LR as printed in PAPER.md section 4, absolute tolerance = half a unit of the last digit)
REFERENCE_LRS = [
    (0, 0.0, 0.0), (1, 0.00665, 5e-6), (5, 0.0333, 5e-5), (10, 0.0665, 5e-5), (15, 0.0998, 5e-5),
    (16, 0.1000, 5e-5), (50, 0.0963, 5e-5), (100, 0.0797, 5e-5), (150, 0.0543, 5e-5), (200, 0.0276, 5e-5),
    (250, 0.0075, 1e-4), (299, 8e-6, 5e-7),
]


@pytest.mark.parametrize("epoch,expected,tol", REFERENCE_LRS)
def test_reference_epoch_stepping_values(epoch, expected, tol):
    s = reference_schedule()
    assert s.lr_at(epoch, 0) == pytest.approx(expected, abs=tol)
    # every batch of the epoch uses the same LR (the reference steps once per epoch)
    assert s.lr_at(epoch, 499) == s.lr_at(epoch, 0) == s.lr_at(epoch, 123)


def test_reference_epoch_zero_has_lr_zero_and_epoch_one_is_500_over_7515():
    s = reference_schedule()
    assert all(s.lr_at(0, i) == 0.0 for i in range(500))
    assert s.lr_at(1, 0) == pytest.approx(0.1 * 500 / 7515, rel=1e-12)


def test_per_step_cosine_exact_values():
    s = LRSchedule(base_lr=0.1, epochs=300, steps_per_epoch=500)   # stepping="step" default
    assert s.total_steps == 150000 and s.warmup_steps == 7500
    assert s.lr_at(0, 0) == 0.0
    assert s.lr_at(0, 1) == pytest.approx(0.1 / 7500, rel=1e-12)
    assert s.lr_at(1, 250) == pytest.approx(0.1 * 750 / 7500, rel=1e-12)
    assert s.lr_at(15, 0) == pytest.approx(0.1, rel=1e-12)          # s = 7500 = end of warm-up
    mid = 7500 + (150000 - 7500) // 2                                  # 78750: cos(pi/2) -> 0.05
    assert s.lr_at(mid // 500, mid % 500) == pytest.approx(0.05, rel=1e-12)
    last = s.lr_at(299, 499)
    assert 0 < last < 1e-9
    # LR changes within an epoch in per-step mode
    assert s.lr_at(100, 0) != s.lr_at(100, 499)
    # monotone decay after warm-up
    lrs = [s.lr_at(e, 0) for e in range(15, 300)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_multiplier_formula():
    assert warmup_cosine_multiplier(0, 100, 10) == 0.0
    assert warmup_cosine_multiplier(5, 100, 10) == 0.5
    assert warmup_cosine_multiplier(10, 100, 10) == 1.0
    assert warmup_cosine_multiplier(55, 100, 10) == pytest.approx(0.5)
    assert warmup_cosine_multiplier(100, 100, 10) == pytest.approx(0.0, abs=1e-15)
    assert warmup_cosine_multiplier(130, 100, 10) == pytest.approx(0.0, abs=1e-15)   # clamped, no rise
    assert warmup_cosine_multiplier(0, 100, 0) == 1.0                                  # no warm-up
    s = 40.0
    assert warmup_cosine_multiplier(s, 100, 10) == pytest.approx(0.5 * (1 + math.cos(math.pi * 30 / 90)))
    with pytest.raises(ValueError):
        warmup_cosine_multiplier(-1, 100, 10)
    with pytest.raises(ValueError):
        warmup_cosine_multiplier(1, 10, 10)


def test_multistep_per_step_decays_at_the_milestone_epoch():
    s = LRSchedule(base_lr=0.1, epochs=300, steps_per_epoch=500, kind="multistep")
    expected = {0: 0.1, 79: 0.1, 80: 0.01, 149: 0.01, 150: 0.001, 249: 0.001, 250: 1e-4, 299: 1e-4}
    for epoch, lr in expected.items():
        assert s.lr_at(epoch, 0) == pytest.approx(lr, rel=1e-12), epoch
        assert s.lr_at(epoch, 499) == s.lr_at(epoch, 0)


def test_multistep_reference_decays_one_epoch_earlier():
    s = LRSchedule(base_lr=0.1, epochs=300, steps_per_epoch=500, kind="multistep", stepping="epoch")
    expected = {0: 0.1, 78: 0.1, 79: 0.01, 148: 0.01, 149: 0.001, 248: 0.001, 249: 1e-4, 299: 1e-4}
    for epoch, lr in expected.items():
        assert s.lr_at(epoch, 0) == pytest.approx(lr, rel=1e-12), epoch


def test_multistep_custom_milestones_and_gamma():
    s = LRSchedule(base_lr=1.0, epochs=10, steps_per_epoch=3, kind="multistep", milestones=[2, 5], gamma=0.5)
    assert [s.lr_at(e, 0) for e in range(10)] == [1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.25]
    assert s.milestones == (2, 5)


def test_constant():
    s = LRSchedule(base_lr=0.03, epochs=2, steps_per_epoch=4, kind="constant")
    assert {s.lr_at(e, i) for e in range(2) for i in range(4)} == {0.03}


def test_set_lr_honours_lr_scale():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr_scale": 0.5}], lr=1.0, momentum=0.9)
    s = LRSchedule(base_lr=0.2, epochs=1, steps_per_epoch=1, kind="constant")
    assert s.set_lr(opt, 0, 0) == 0.2
    assert opt.param_groups[0]["lr"] == 0.2
    assert opt.param_groups[1]["lr"] == pytest.approx(0.1)


def test_is_frozen():
    s = LRSchedule(base_lr=0.1, epochs=1, steps_per_epoch=1)
    with pytest.raises(Exception):
        s.base_lr = 1.0


@pytest.mark.parametrize("kw,match", [
    ({"epochs": 0}, "epochs must be > 0"),
    ({"steps_per_epoch": 0}, "steps_per_epoch must be > 0"),
    ({"kind": "linear"}, "unknown LR schedule kind 'linear'"),
    ({"stepping": "batch"}, "unknown LR stepping 'batch'"),
    ({"warmup_ratio": 1.0}, r"warmup_ratio must be in \[0, 1\)"),
    ({"warmup_ratio": -0.1}, r"warmup_ratio must be in \[0, 1\)"),
    ({"stepping": "epoch"}, "needs a positive num_train_examples"),
    ({"stepping": "epoch", "num_train_examples": 100}, "needs a positive batch_size"),
    ({"gamma": 0.0}, "gamma must be > 0"),
    ({"base_lr": -1.0}, "base_lr must be"),
])
def test_invalid_arguments(kw, match):
    args = dict(base_lr=0.1, epochs=3, steps_per_epoch=5)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        LRSchedule(**args)


def test_multistep_epoch_stepping_needs_no_dataset_size():
    # only cosine per-epoch stepping needs the reference's T_max (num_train_examples, batch_size);
    # multistep per-epoch stepping is built without them and its LR depends on the epoch alone
    lrs = []
    for steps in (5, 500):
        s = LRSchedule(base_lr=0.1, epochs=3, steps_per_epoch=steps, kind="multistep", stepping="epoch",
                       milestones=(1, 2), gamma=0.1)
        assert s.num_train_examples is None and s.batch_size is None
        lrs.append([s.lr_at(e, i) for e in range(3) for i in (0, steps - 1)])
    assert lrs[0] == lrs[1] == pytest.approx([0.01, 0.01, 0.001, 0.001, 0.001, 0.001])   # each decay one epoch early
    with pytest.raises(ValueError, match="needs a positive num_train_examples"):
        LRSchedule(base_lr=0.1, epochs=3, steps_per_epoch=5, kind="cosine", stepping="epoch")


def test_out_of_range_step_is_rejected():
    s = LRSchedule(base_lr=0.1, epochs=3, steps_per_epoch=5)
    for e, i in [(3, 0), (-1, 0), (0, 5), (0, -1)]:
        with pytest.raises(ValueError, match="outside"):
            s.lr_at(e, i)
