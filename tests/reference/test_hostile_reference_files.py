"""Hostile reference files are refused in one line before they cost memory: views that declare more
values than the file stores, YAML aliases, ill-typed or unrecordable configuration values, and
weights holding NaN (at conversion and at evaluation)."""

from __future__ import annotations

import json
import logging
import resource
import sys

import pytest
import torch
import yaml

from reference_format import reference_config, reference_state

from attncnn.cli import main
from attncnn.errors import AttncnnError, InputError
from attncnn.reference import convert_reference
from attncnn.runs import CheckpointError, load_checkpoint, write_checkpoint

#: bytes ru_maxrss counts in (kilobytes on Linux, bytes on macOS)
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _RSS_UNIT


def _save(folder, state, cfg=None, **extra):
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": 3, "test_accuracy": 0.5, "model_state_dict": state, **extra}, folder / "final.checkpoint")
    if cfg is not None:
        (folder / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder / "final.checkpoint"


def _nothing_left(tmp_path, out):
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}")]


def _widened(state: dict, dim: int, width: int) -> dict:
    """``state``'s tensors at width ``width`` instead of ``dim`` (every multiple of dim scaled), each
    a stride-0 view of one stored number: a few KB on disk, gigabytes once expanded."""
    def shape(t):
        return tuple(s // dim * width if s % dim == 0 else s for s in t.shape)
    return {k: torch.zeros((), dtype=v.dtype).expand(shape(v)) for k, v in state.items()}


def test_views_that_declare_more_than_the_file_stores_are_refused_before_any_allocation(tmp_path):
    # width 20,000: the shapes agree with each other, and expanding them would take about 5 GB
    cfg = reference_config("quadratic", layers=1, heads=3, dim=8, mlp=6)
    path = _save(tmp_path / "ref", _widened(reference_state(cfg), 8, 20_000), {**cfg, "hidden_size": 20_000})
    assert path.stat().st_size < 10_000
    before = _peak_rss()
    with pytest.raises(CheckpointError, match=r"final\.checkpoint: tensor .* declares shape .*strides \(0, 0\)"
                                              r".*repeats its stored values.*refused before anything is expanded"):
        convert_reference(path, tmp_path / "run")
    assert _peak_rss() - before < 200 * 2**20
    _nothing_left(tmp_path, tmp_path / "run")


def test_tensors_sharing_one_storage_many_times_over_are_refused(tmp_path):
    # each view is a plain matrix, but 40 layers are one stored layer: a whole network of 40 MB
    # declared in 1 MB (in the same way, 10,000 layers of width 2,000 would declare 160 GB)
    cfg = reference_config("quadratic", layers=1, heads=3, dim=256, mlp=6)
    state = reference_state(cfg)
    layer = {k[len("encoder.layer.0."):]: v for k, v in state.items() if k.startswith("encoder.layer.0.")}
    state.update({f"encoder.layer.{i}.{k}": v for i in range(1, 40) for k, v in layer.items()})
    path = _save(tmp_path / "ref", state, {**cfg, "num_hidden_layers": 40})
    with pytest.raises(CheckpointError, match=r"its tensors declare [\d,]+ bytes but the file stores [\d,]+: they "
                                              r"share storages more than 2 times over"):
        convert_reference(path, tmp_path / "run")
    _nothing_left(tmp_path, tmp_path / "run")


def test_a_transposed_or_sliced_weight_is_not_a_hostile_view(tmp_path):
    cfg = reference_config("quadratic", layers=1, heads=3, dim=8, mlp=6)
    state = reference_state(cfg)
    name = "encoder.layer.0.intermediate.dense.weight"
    state[name] = state[name].T.contiguous().T                 # strides (1, 6): stored once, another layout
    assert not state[name].is_contiguous()
    assert convert_reference(_save(tmp_path / "ref", state, cfg), tmp_path / "run").is_dir()


def test_yaml_aliases_are_refused_before_they_are_expanded(tmp_path):
    cfg = reference_config("quadratic", layers=1, heads=3, dim=8, mlp=6)
    path = _save(tmp_path / "ref", reference_state(cfg))
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]     # 9**10 strings
    (tmp_path / "ref" / "config.yaml").write_text(yaml.safe_dump(cfg) + "\n".join(lines) + "\n")
    assert (tmp_path / "ref" / "config.yaml").stat().st_size < 4_000
    before = _peak_rss()
    with pytest.raises(InputError, match=r"config\.yaml: line \d+ uses the YAML alias \*a0; .*write the values out"):
        convert_reference(path, tmp_path / "run")
    assert _peak_rss() - before < 100 * 2**20
    _nothing_left(tmp_path, tmp_path / "run")


@pytest.mark.parametrize("line, match", [
    ("hidden_dropout_prob: abc", r"config\.yaml: hidden_dropout_prob is 'abc', not a number; write e\.g\. "
                                 r"hidden_dropout_prob: 0\.1"),
    ("num_hidden_layers: 1.5", r"num_hidden_layers is 1\.5, not an integer"),
    ("use_gaussian_attention: 'yes'", r"use_gaussian_attention is 'yes', not true or false"),
    ("run_started: 2020-01-31", r"config\.yaml: run_started is a date \(datetime\.date\(2020, 1, 31\)\), which a "
                                r"run folder cannot record; quote it"),
])
def test_an_ill_typed_or_unrecordable_value_is_one_line_naming_the_key(tmp_path, capsys, line, match):
    cfg = reference_config("quadratic", layers=1, heads=3, dim=8, mlp=6)
    path = _save(tmp_path / "ref", reference_state(cfg))
    key = line.split(":")[0]
    (tmp_path / "ref" / "config.yaml").write_text(yaml.safe_dump({k: v for k, v in cfg.items() if k != key})
                                                  + line + "\n")
    with pytest.raises(InputError, match=match):
        convert_reference(path, tmp_path / "run")
    _nothing_left(tmp_path, tmp_path / "run")
    assert main(["convert-reference", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0]


def test_a_number_written_as_yaml_11_text_is_still_a_number(tmp_path):
    cfg = reference_config("quadratic", layers=1, heads=3, dim=8, mlp=6)
    path = _save(tmp_path / "ref", reference_state(cfg))
    text = yaml.safe_dump({k: v for k, v in cfg.items() if k != "layer_norm_eps"})
    (tmp_path / "ref" / "config.yaml").write_text(text + "layer_norm_eps: 1e-12\n")      # YAML 1.1 reads a string
    run = convert_reference(path, tmp_path / "run")
    assert json.loads((run / "config.json").read_text())["model"]["layer_norm_eps"] == 1e-12


def test_a_config_yaml_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    import os

    cfg = reference_config("quadratic", layers=1, heads=3, dim=8, mlp=6)
    path = _save(tmp_path / "ref", reference_state(cfg))
    os.mkfifo(tmp_path / "config.fifo")
    with pytest.raises(InputError, match="not a regular file"):
        convert_reference(path, tmp_path / "run", config=tmp_path / "config.fifo")


def test_non_finite_weights_are_refused_at_conversion(tmp_path):
    cfg = reference_config("quadratic", layers=1, heads=3, dim=8, mlp=6)
    state = reference_state(cfg)
    state["classifier.weight"][0, 0] = float("nan")
    state["encoder.layer.0.output.dense.bias"][1] = float("inf")
    with pytest.raises(InputError, match=r"the weights encoder\.layer\.0\.output\.dense\.bias, classifier\.weight "
                                         r"hold NaN or infinite values"):
        convert_reference(_save(tmp_path / "ref", state, cfg), tmp_path / "run")
    _nothing_left(tmp_path, tmp_path / "run")


def test_evaluate_says_in_one_line_that_a_checkpoints_weights_are_not_finite(tmp_path, capsys):
    cfg = reference_config("quadratic", layers=1, heads=3, dim=8, mlp=6)
    run = convert_reference(_save(tmp_path / "ref", reference_state(cfg), cfg), tmp_path / "run")
    last = run / "checkpoints" / "last.safetensors"
    checkpoint = load_checkpoint(last)
    checkpoint.model_state["head.weight"][0, 0] = float("nan")
    write_checkpoint(last, checkpoint)
    # the data set is never read: the refusal comes first
    assert main(["evaluate", str(run), "--data", str(tmp_path / "no-such-data")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the weights head.weight hold NaN or infinite values" in err[0]
    assert "--checkpoint best" in err[0]


def test_entries_beside_the_weights_are_ignored_and_named(tmp_path, caplog):
    cfg = reference_config("quadratic", layers=1, heads=3, dim=8, mlp=6)
    path = _save(tmp_path / "ref", reference_state(cfg), cfg, optimizer_state_dict={"state": {}, "param_groups": []},
                 scheduler={"last_epoch": 3})
    with caplog.at_level(logging.INFO, logger="attncnn.reference"):
        convert_reference(path, tmp_path / "run")
    assert any("ignored the entries optimizer_state_dict, scheduler" in r.getMessage() for r in caplog.records)


def test_dropout_outside_0_1_is_one_line(tmp_path, capsys):
    assert main(["train", "--preset", "demo", "--set", "attn_dropout=2.5", "--out", str(tmp_path / "r"),
                 "--data", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["attncnn train: error: attn_dropout must be a probability between 0 and 1 (the share of values "
                   "dropped), got 2.5; e.g. --set attn_dropout=0.1, or 0 for none"]
    with pytest.raises(AttncnnError, match="dropout must be a probability"):
        from attncnn.models import build_model
        build_model("quadratic-mini", dropout=-0.1)
    assert not (tmp_path / "r").exists()
