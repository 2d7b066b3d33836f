"""``attncnn train``'s flags are built from TrainConfig's fields (the recipe) and RunOptions' (the
run-time options, in their own group): one declaration per option."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from attncnn.cli import build_parser, main
from attncnn.models import ImageTransformer
from attncnn.runs import TrainConfig, resolve_config
from attncnn.runs.config import MACHINE_FIELDS
from attncnn.cli._parsing import add_config_options, flag_name, given_options
from attncnn.training import RunOptions


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["train", *argv])


@pytest.mark.parametrize("fields_of", [TrainConfig, RunOptions])
def test_every_field_has_exactly_one_flag_with_the_fields_help(fields_of):
    parser = argparse.ArgumentParser()
    add_config_options(parser, fields_of)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    fields = dataclasses.fields(fields_of)
    assert set(actions) == {f.name for f in fields}
    for f in fields:
        assert actions[f.name].help.startswith(f.metadata["help"]) and flag_name(f) in actions[f.name].option_strings
        assert "default" in actions[f.name].help or "required" in actions[f.name].help, f.name


def test_the_run_time_options_are_their_own_group_and_no_part_of_the_recipe():
    train = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "train")[1]
    (group,) = [g for g in train._action_groups if g.title == "run-time options"]
    assert {a.dest for a in group._group_actions} == {f.name for f in dataclasses.fields(RunOptions)}
    # measure_paths: an option of the measured path choice this version dropped; older files' value is read and
    # discarded (tests/perf/test_plan.py)
    assert set(MACHINE_FIELDS) - {"measure_paths"} <= {a.dest for a in group._group_actions}
    assert not set(MACHINE_FIELDS) & {f.name for f in dataclasses.fields(TrainConfig)}


@pytest.mark.parametrize("path", ["impl", "eval_impl"])
def test_an_attention_path_set_as_a_model_option_names_the_flag_that_gives_it(tmp_path, capsys, path):
    flag = "--" + path.replace("_", "-")
    assert main(["train", "--preset", "demo", "--set", f"{path}=dense", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--set {path}=dense" in err and f"pass {flag} dense instead" in err
    assert not (tmp_path / "run").exists()


def test_only_the_options_the_user_passed_are_given():
    assert given_options(_parse()) == {}
    # a value equal to the default still counts as given (it used to be invisible for --preset quadratic)
    assert given_options(_parse("--preset", "quadratic", "--epochs", "300")) == {"preset": "quadratic", "epochs": 300}
    args = _parse("--set", "num_heads=4", "--set", "attention=learned", "--milestones", "3", "7",
                  "--no-deterministic", "--download", "--train-subset", "50", "--impl", "dense")
    assert given_options(args) == {"model": {"num_heads": 4, "attention": "learned"}, "milestones": [3, 7],
                                   "train_subset": 50}
    assert given_options(args, RunOptions) == {"deterministic": False, "download": True, "impl": "dense"}


def test_compile_has_three_states_on_the_command_line():
    """--compile, --no-compile, or neither: the run decides by measuring (RunOptions.compile None)."""
    assert given_options(_parse("--compile"), RunOptions) == {"compile": True}
    assert given_options(_parse("--no-compile"), RunOptions) == {"compile": False}
    assert "compile" not in given_options(_parse(), RunOptions) and RunOptions().compile is None


def test_choices_come_from_the_field():
    with pytest.raises(SystemExit):
        _parse("--schedule", "linear")
    with pytest.raises(ValueError, match="schedule must be one of cosine, multistep, constant"):
        TrainConfig(schedule="linear")


def test_model_options_are_checked_without_building_the_model(monkeypatch):
    def refuse(self, config):
        raise AssertionError("a model was built to validate options")

    monkeypatch.setattr(ImageTransformer, "__init__", refuse)
    with pytest.raises(ValueError, match="head width must be even, got 401"):
        resolve_config("learned-content", model={"dim": 401})
    with pytest.raises(ValueError, match="head_dim must be >= 1"):
        resolve_config("quadratic", model={"head_dim": 0})
    assert resolve_config("learned-content", model={"dim": 64}).model == {"dim": 64}


def test_a_bad_model_option_is_refused_before_any_data_is_read(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--preset", "learned-content", "--set", "dim=401", "--data", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "head width must be even" in err and "nowhere" not in err
    assert not (tmp_path / "runs").exists()


def test_resume_names_every_recipe_flag_it_would_ignore(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "run"), "--preset", "quadratic", "--set", "dim=8",
                 "--epochs", "3", "--no-deterministic", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--preset" in err and "--set" in err and "--epochs" in err
    assert "--deterministic" not in err and "--device" not in err           # run-time options: taken
