import pytest

from attncnn.runs.config import TrainConfig, recipe_from_dict, resolve_config


def test_defaults_are_the_paper_recipe():
    c = TrainConfig()
    assert (c.epochs, c.batch_size, c.lr, c.momentum, c.weight_decay, c.warmup_ratio, c.schedule) == \
        (300, 100, 0.1, 0.9, 1e-4, 0.05, "cosine")
    assert c.lr_stepping == "step" and c.optimizer == "sgd"


def test_resolve_applies_preset_then_overrides():
    c = resolve_config("resnet18", epochs=5, lr=None)
    assert c.schedule == "multistep" and c.milestones == [80, 150, 250]
    assert c.epochs == 5 and c.lr == 0.1
    assert resolve_config("demo").epochs < 300


@pytest.mark.parametrize("values,match", [
    ({"epochs": 0}, "epochs must be a positive integer"),
    ({"batch_size": -1}, "batch_size must be a positive integer"),
    ({"preset": "nope"}, "unknown preset 'nope'"),
    ({"epoch": 3}, "unknown training option 'epoch'"),
    ({"lr": "fast"}, "'lr' must be"),
    ({"milestones": [1.5]}, "'milestones' must be"),
    ({"schedule": "linear"}, "schedule must be"),
    ({"optimizer": "adam"}, "optimizer must be one of sgd, adamw, got 'adam'"),
    ({"train_subset": 0}, "train_subset must be positive"),
])
def test_bad_values_are_rejected_by_name(values, match):
    with pytest.raises(ValueError, match=match):
        recipe_from_dict(values)


def test_round_trip_through_dict():
    c = resolve_config("quadratic", epochs=3, model={"num_heads": 4})
    assert recipe_from_dict(c.to_dict())[0] == c
