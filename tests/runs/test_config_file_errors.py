"""A hand-edited config.json that does not hold a valid configuration is refused by `attncnn train
--resume` with one line naming the file and the key, the expected type in words, the value as written
and what to write instead; the file is left as it was."""

from __future__ import annotations

import json

import pytest

from attncnn.cli import main
from attncnn.runs import resolve_config


def _edited(tmp_path, name="run", **changes) -> tuple:
    """A run folder whose config.json (as `attncnn train` writes it) has ``changes`` made by hand."""
    folder = tmp_path / name
    folder.mkdir()
    config = resolve_config("demo", data="cifar10", epochs=2).to_dict()
    config.update(changes)
    path = folder / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return folder, path


def _refusal(folder, path, capsys) -> str:
    before = path.read_bytes()
    assert main(["train", "--resume", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert path.read_bytes() == before                                   # nothing rewritten
    assert "<class" not in err
    return err


@pytest.mark.parametrize("key, value, expected, fix", [
    ("epochs", "2", 'must be an integer, got "2" (a string)', 'write "epochs": 2 in {path}'),
    ("lr", "fast", 'must be a number, got "fast" (a string)', 'write a number for "lr" in {path}, e.g. "lr": 0.1'),
    # an older run's machine field, read one way as a resume's default: still checked by name
    ("deterministic", "yes", 'must be true, false or null, got "yes" (a string)',
     'write true, false or null for "deterministic" in {path}'),
    ("milestones", [1.5], "must be a list of integers, got [1.5] (a list)",
     'write a list of integers for "milestones" in {path}, e.g. "milestones": [80, 150, 250]'),
    ("train_subset", 10.0, "must be an integer or null, got 10.0 (a number)", 'write "train_subset": 10 in {path}'),
])
def test_a_value_of_the_wrong_type_names_the_file_the_key_the_type_and_the_fix(tmp_path, capsys, key, value,
                                                                               expected, fix):
    folder, path = _edited(tmp_path, **{key: value})
    err = _refusal(folder, path, capsys)
    assert err.startswith(f"attncnn train: error: {path}: training option {key!r} {expected}; ")
    assert err.endswith(fix.format(path=path))


def test_an_unknown_key_names_the_file_and_the_likely_one(tmp_path, capsys):
    folder, path = _edited(tmp_path, epoch=3)
    err = _refusal(folder, path, capsys)
    assert err.startswith(f"attncnn train: error: {path}: unknown training option 'epoch' (did you mean 'epochs'?); "
                          f"rename or remove it in {path}; valid options: preset, model, data,")


def test_a_model_option_names_the_file_and_its_model_entry(tmp_path, capsys):
    folder, path = _edited(tmp_path, model={"dim": "16"})
    err = _refusal(folder, path, capsys)
    assert f'{path} (its "model" entry): model option \'dim\' must be an integer, got "16" (a string); ' \
           f'write "dim": 16 in {path}' in err
    folder, path = _edited(tmp_path, "other", model={"heads": 4})
    assert "unknown model option 'heads' for image-transformer (did you mean 'num_heads'?); rename or remove it " \
           f"in {path}" in _refusal(folder, path, capsys)


def test_a_value_out_of_range_names_the_file(tmp_path, capsys):
    folder, path = _edited(tmp_path, epochs=0)
    assert _refusal(folder, path, capsys) == f"attncnn train: error: {path}: epochs must be a positive integer, " \
                                             "got 0; correct it there"
