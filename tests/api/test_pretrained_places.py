"""Where :func:`attncnn.pretrained` looked, said so that a user can act on it: the fix first, each
place once, and a results folder that is not there named rather than passed over in silence."""

from __future__ import annotations

import logging

import pytest

import attncnn
from attncnn.api import PACKAGED_MODELS, pretrained_path

PACKAGED = PACKAGED_MODELS / "mini-long" / "quadratic-mini" / "seed0"
LOGGER = "attncnn.api.pretrained"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNCNN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_preset_never_trained_here_leads_with_how_to_train_it_and_names_each_place_once(tmp_path, cache):
    # it used to list thirteen folders (one per suite of results/) before the fix
    (tmp_path / "results" / "mini").mkdir(parents=True)
    (tmp_path / "results" / "efficiency").mkdir()
    with pytest.raises(FileNotFoundError) as err:
        attncnn.pretrained("demo", root=tmp_path / "results")
    message = str(err.value)
    assert message.startswith("no trained model 'demo' seed 0. ") and "No trained model is there." in message
    with pytest.raises(FileNotFoundError) as err:
        attncnn.pretrained("demo")
    message = str(err.value)
    assert message.startswith("no trained model 'demo' seed 0. 'demo' is a preset none of whose finished runs is "
                              "there: train it with `attncnn train --preset demo`")
    looked = message.split("Looked for <suite>/demo/seed0 and demo/seed0 in ", 1)[1].split(". ", 1)[0]
    assert looked.split(", ")[-2:] == [str(cache / "models"), str(PACKAGED_MODELS)]
    assert "/mini-long/demo/seed0" not in message                 # no folder listed per suite


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_results_variable_naming_no_folder_is_said_with_the_model_loaded_instead(tmp_path, monkeypatch, cache,
                                                                                  caplog, kind):
    value = tmp_path / "my-results"
    if kind == "file":
        value.write_text("not a folder")
    monkeypatch.setenv("ATTNCNN_RESULTS", str(value))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert pretrained_path("quadratic-mini") == PACKAGED
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"ATTNCNN_RESULTS={value} {'does not exist' if kind == 'missing' else 'is a file'}")
    assert f"loaded quadratic-mini from {PACKAGED} instead" in warnings[0]


def test_a_results_variable_naming_a_folder_is_used_without_a_word(tmp_path, monkeypatch, cache, caplog):
    (tmp_path / "my-results").mkdir()
    monkeypatch.setenv("ATTNCNN_RESULTS", str(tmp_path / "my-results"))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert pretrained_path("quadratic-mini") == PACKAGED           # not there: the packaged one, as documented
    assert not [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
