"""``attncnn train``'s flags are built from TrainConfig's fields: one declaration per option."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from attncnn.cli import build_parser, main
from attncnn.models import ImageTransformer
from attncnn.runs import TrainConfig, resolve_config
from attncnn.runs.options import add_config_options, flag_name, given_options


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["train", *argv])


def test_every_field_has_exactly_one_flag_with_the_fields_help():
    parser = argparse.ArgumentParser()
    add_config_options(parser)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    fields = dataclasses.fields(TrainConfig)
    assert set(actions) == {f.name for f in fields}
    for f in fields:
        assert actions[f.name].help.startswith(f.metadata["help"]) and flag_name(f) in actions[f.name].option_strings
        assert "default" in actions[f.name].help or "required" in actions[f.name].help, f.name


def test_only_the_options_the_user_passed_are_given():
    assert given_options(_parse()) == {}
    # a value equal to the default still counts as given (it used to be invisible for --preset quadratic)
    assert given_options(_parse("--preset", "quadratic", "--epochs", "300")) == {"preset": "quadratic", "epochs": 300}
    given = given_options(_parse("--set", "num_heads=4", "--set", "attention=learned", "--milestones", "3", "7",
                                 "--no-deterministic", "--download", "--train-subset", "50"))
    assert given == {"model": {"num_heads": 4, "attention": "learned"}, "milestones": [3, 7],
                     "deterministic": False, "download": True, "train_subset": 50}


def test_compile_has_three_states_on_the_command_line():
    """--compile, --no-compile, or neither: the run decides by measuring (TrainConfig.compile None)."""
    assert given_options(_parse("--compile")) == {"compile": True}
    assert given_options(_parse("--no-compile")) == {"compile": False}
    assert "compile" not in given_options(_parse())
    assert resolve_config("demo").compile is None and resolve_config("demo", compile=False).compile is False


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


def test_resume_names_every_flag_it_would_ignore(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "run"), "--preset", "quadratic", "--set", "dim=8",
                 "--no-deterministic"]) == 2
    err = capsys.readouterr().err
    assert "--preset" in err and "--set" in err and "--deterministic" in err
