"""Reference checkpoints in and out: the converted network computes the reference's function."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch
import yaml

from reference_format import reference_config, reference_forward, reference_state

import attncnn
import attncnn.reference.kinds as kinds
from attncnn.errors import AttncnnError, InputError
from attncnn.reference import PROVENANCE_FILE, convert_reference, export_reference
from attncnn.runs import CheckpointError, load_checkpoint

KINDS = ["quadratic", "quadratic-generalized", "learned", "learned-content-9ffaa", "content"]
LEARNED = ["learned", "learned-content-9ffaa"]


def save_reference(folder, cfg, state, *, epoch=41, accuracy=0.8125, name="final.checkpoint", config=True,
                   legacy=False):
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": epoch, "test_accuracy": accuracy, "model_state_dict": state}, folder / name,
               _use_new_zipfile_serialization=not legacy)
    if config:
        (folder / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return folder / name


def converted_logits(run, images):
    model = attncnn.load_model(run, dtype=torch.float64)
    return model.network(images.double())


@pytest.mark.parametrize("kind", KINDS)
def test_the_converted_network_computes_the_reference_formulas(tmp_path, kind):
    # non-default sizes come along: 3 layers, width 12, 3 heads, MLP 10, 7 classes, a 16x12 token grid
    # (the reference's code runs square grids only; its formula is written for any), learned tables
    # 5 wide for M = 17
    learned = kind in LEARNED
    cfg = reference_config(kind, layers=3, heads=3, dim=12, mlp=10, width=5 if learned else -1,
                           max_position=17 if learned else 16, dataset="/data/custom")
    state = reference_state(cfg, classes=7)
    run = convert_reference(save_reference(tmp_path / "ref", cfg, state), tmp_path / "run", data="cifar10")
    images = torch.randn(2, 3, 32, 24, dtype=torch.float64)
    expected = reference_forward(state, cfg, images)
    torch.testing.assert_close(converted_logits(run, images), expected, rtol=1e-10, atol=1e-10)
    net = attncnn.load_model(run).network
    assert (net.config.num_layers, net.config.dim, net.config.num_heads, net.config.mlp_dim,
            net.config.num_classes, net.config.attention) == (3, 12, 3, 10, 7, kind)
    if learned:
        assert (net.config.max_size, net.config.table_dim) == (17, 5)
        recipe = json.loads((run / "config.json").read_text())
        assert (recipe["preset"], recipe["model"]["table_dim"], recipe["model"]["max_size"]) == (kind, 5, 17)


@pytest.mark.parametrize("kind", LEARNED)
def test_without_the_axis_swap_the_learned_model_is_another_function(tmp_path, monkeypatch, kind):
    cfg = reference_config(kind, layers=1, heads=2, dim=8)
    state = reference_state(cfg)
    images = torch.randn(2, 3, 32, 24, dtype=torch.float64)
    expected = reference_forward(state, cfg, images)
    path = save_reference(tmp_path / "ref", cfg, state)
    swapped = convert_reference(path, tmp_path / "swapped")
    torch.testing.assert_close(converted_logits(swapped, images), expected, rtol=1e-10, atol=1e-10)
    learned = next(e for e in kinds.REFERENCE_KINDS if e.kind == kind)
    assert learned.renames[:len(kinds.LEARNED_RENAMES)] == kinds.LEARNED_RENAMES
    unswapped = tuple((ours, ours) for ours, _ in kinds.LEARNED_RENAMES) + learned.renames[len(kinds.LEARNED_RENAMES):]
    monkeypatch.setattr(kinds, "REFERENCE_KINDS", tuple(
        dataclasses.replace(e, renames=unswapped) if e.kind == kind else e for e in kinds.REFERENCE_KINDS))
    wrong = converted_logits(convert_reference(path, tmp_path / "unswapped"), images)
    assert (wrong - expected).abs().max() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_export_then_convert_gives_every_tensor_back(tmp_path, kind):
    cfg = reference_config(kind, heads=2)
    state = reference_state(cfg)
    run = convert_reference(save_reference(tmp_path / "ref", cfg, state), tmp_path / "run")
    out = export_reference(run, tmp_path / "back" / "final.checkpoint")
    back = torch.load(out, weights_only=True)
    assert back["epoch"] == 41 and back["test_accuracy"] == 0.8125
    assert set(back["model_state_dict"]) == set(state)            # R dropped, mask and relative_indices kept
    for name, tensor in state.items():
        assert torch.equal(back["model_state_dict"][name], tensor), name
        assert back["model_state_dict"][name].dtype == tensor.dtype, name
    written = yaml.safe_load((tmp_path / "back" / "config.yaml").read_text())
    assert {k: written[k] for k in cfg if k != "dataset"} == {k: v for k, v in cfg.items() if k != "dataset"}
    again = convert_reference(out, tmp_path / "again")              # and ours survive the trip out and in
    first, second = load_checkpoint(run / "checkpoints" / "last.safetensors"), \
        load_checkpoint(again / "checkpoints" / "last.safetensors")
    assert all(torch.equal(first.model_state[k], second.model_state[k]) for k in first.model_state)


@pytest.mark.parametrize("preset, extra", [("quadratic-generalized", {}),
                                           ("learned-content-9ffaa", {"max_size": 10, "table_dim": 5})])
def test_an_exported_network_of_ours_converts_back_to_identical_weights(tmp_path, preset, extra):
    # a network that did not come from the reference: content attention whose value map is not the
    # identity is folded into the output map on the way out (exact function, not identical weights),
    # so the round trip is checked on kinds whose names alone change
    from attncnn.models import build_model
    from attncnn.runs import Checkpoint, TrainConfig, write_checkpoint

    torch.manual_seed(3)
    sizes = {"num_layers": 2, "dim": 8, "mlp_dim": 6, "num_heads": 4, **extra}
    model = build_model(preset, **sizes)
    recipe = TrainConfig(preset=preset, model=sizes)
    meta = {"arch": model.arch, "model_config": dataclasses.asdict(model.config), "config": recipe.to_dict(),
            "epoch": 5, "metrics": {"test_accuracy": 0.5}}
    write_checkpoint(tmp_path / "ours.safetensors", Checkpoint(model.state_dict(), None, {}, meta))
    out = export_reference(tmp_path / "ours.safetensors", tmp_path / "ref" / "0004.checkpoint")
    back = load_checkpoint(convert_reference(out, tmp_path / "run") / "checkpoints" / "last.safetensors")
    assert set(back.model_state) == set(model.state_dict())
    assert all(torch.equal(back.model_state[k], v) for k, v in model.state_dict().items())
    assert back.metadata["epoch"] == 5 and back.metadata["config"]["epochs"] == 300
    assert all(back.metadata["model_config"][k] == v for k, v in sizes.items())


def test_the_run_folder_records_where_its_weights_came_from(tmp_path):
    cfg = reference_config("quadratic")
    path = save_reference(tmp_path / "ref", cfg, reference_state(cfg), name="best.checkpoint")
    run = convert_reference(path, tmp_path / "run")
    record = json.loads((run / PROVENANCE_FILE).read_text())
    import hashlib
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (record["epoch"], record["test_accuracy"], record["source"]) == (41, 0.8125, str(path.resolve()))
    assert record["config"]["num_keep_checkpoints"] == 30 and record["config_source"].endswith("config.yaml")
    recipe = json.loads((run / "config.json").read_text())
    assert (recipe["preset"], recipe["schedule"], recipe["lr_stepping"], recipe["checkpoint_every"]) == \
        ("quadratic", "cosine", "epoch", 10)
    meta = load_checkpoint(run / "checkpoints" / "last.safetensors").metadata
    assert meta["epoch"] == 42 and meta["classes"][0] == "airplane" and (run / "finished.json").is_file()
    assert tuple(meta["classes"]) == attncnn.data.CIFAR10_CLASSES


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-pickle"])
def test_data_parallel_names_and_gpu_saved_tensors_load(tmp_path, monkeypatch, legacy):
    cfg = reference_config("quadratic")
    state = reference_state(cfg)
    wrapped = {"module." + k: v for k, v in state.items()}
    # torch.save records each storage's device; a file written on a GPU names "cuda:0", which a
    # CPU-only torch.load refuses unless map_location moves it: write such a file here
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
    # (the reference's 2019 PyTorch wrote the legacy pickle format, today's the zip one)
    path = save_reference(tmp_path / "ref", cfg, wrapped, legacy=legacy)
    monkeypatch.undo()
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(path, weights_only=True)
    run = convert_reference(path, tmp_path / "run")
    images = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    torch.testing.assert_close(converted_logits(run, images), reference_forward(state, cfg, images),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", LEARNED)
def test_sizes_come_from_the_tensors_without_a_config(tmp_path, kind):
    cfg = reference_config(kind, layers=3, heads=5, dim=10, mlp=7, max_position=9, pooling=1, width=6)
    state = reference_state(cfg, classes=100)
    run = convert_reference(save_reference(tmp_path / "ref", cfg, state, config=False), tmp_path / "run")
    images = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(converted_logits(run, images), reference_forward(state, cfg, images),
                               rtol=1e-10, atol=1e-10)
    recipe = json.loads((run / "config.json").read_text())
    assert recipe["data"] == "cifar100" and recipe["model"]["max_size"] == 9 and recipe["model"]["pooling"] == 1
    assert (recipe["preset"], recipe["model"]["attention"], recipe["model"]["table_dim"]) == (kind, kind, 6)
    assert attncnn.load_model(run).network.config.num_heads == 5
    assert json.loads((run / PROVENANCE_FILE).read_text())["config"] is None


def test_a_pruned_model_keeps_its_head_counts(tmp_path):
    cfg = reference_config("quadratic-generalized", layers=2, heads=4, prune_degenerated_heads=True)
    state = reference_state(cfg)
    s = "encoder.layer.1.attention.self."
    state[s + "attention_centers"], state[s + "attention_spreads"] = state[s + "attention_centers"][:3], \
        state[s + "attention_spreads"][:3]
    state[s + "value.weight"] = state[s + "value.weight"][:, :3 * 8]
    run = convert_reference(save_reference(tmp_path / "ref", cfg, state), tmp_path / "run")
    assert attncnn.load_model(run).network.config.layer_heads == [4, 3]
    images = torch.randn(1, 3, 16, 16, dtype=torch.float64)
    torch.testing.assert_close(converted_logits(run, images), reference_forward(state, cfg, images),
                               rtol=1e-10, atol=1e-10)


def _refused(tmp_path, path, match, **kwargs):
    out = tmp_path / "run"
    with pytest.raises(AttncnnError, match=match):
        convert_reference(path, out, **kwargs)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".run")]


def test_bad_inputs_are_refused_and_leave_nothing(tmp_path):
    cfg = reference_config("quadratic")
    state = reference_state(cfg)
    good = save_reference(tmp_path / "ref", cfg, state)
    truncated = tmp_path / "truncated.checkpoint"
    truncated.write_bytes(good.read_bytes()[:300])
    _refused(tmp_path, truncated, "not a readable PyTorch file")
    # an object weights_only refuses to build (any class but tensors and plain values)
    torch.save({"epoch": 1, "model_state_dict": state, "args": argparse.Namespace(lr=0.1)},
               tmp_path / "pickle.checkpoint")
    _refused(tmp_path, tmp_path / "pickle.checkpoint", "other than tensors")
    torch.save({"weights": state}, tmp_path / "other.checkpoint")
    _refused(tmp_path, tmp_path / "other.checkpoint", "not a reference checkpoint")
    _refused(tmp_path, good, "num_hidden_layers=3 but", config={**cfg, "num_hidden_layers": 3})
    _refused(tmp_path, good, "hidden_size=9 but", config={**cfg, "hidden_size": 9})
    _refused(tmp_path, good, "blur", config={**cfg, "attention_gaussian_blur_trick": True})
    content = reference_config("content")
    _refused(tmp_path, save_reference(tmp_path / "c", content, reference_state(content), config=False),
             "head count of plain content attention")
    # learned + content tensors under a learned-only configuration (and the reverse) name the flag
    learned_content = reference_config("learned-content-9ffaa")
    lc_state = reference_state(learned_content)
    _refused(tmp_path, save_reference(tmp_path / "lc", learned_content, lc_state),
             "use_attention_data=False but", config={**learned_content, "use_attention_data": False})
    _refused(tmp_path, save_reference(tmp_path / "l", learned_content, reference_state(reference_config("learned"))),
             "use_attention_data=True but")
    with pytest.raises(CheckpointError):
        convert_reference(truncated, tmp_path / "run")
    with pytest.raises(InputError):
        convert_reference(good, tmp_path / "run", config={**cfg, "num_hidden_layers": 3})


def test_an_existing_folder_is_kept(tmp_path):
    cfg = reference_config("quadratic")
    path = save_reference(tmp_path / "ref", cfg, reference_state(cfg))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mine.txt").write_text("keep")
    with pytest.raises(AttncnnError, match="not empty"):
        convert_reference(path, tmp_path / "run")
    assert (tmp_path / "run" / "mine.txt").read_text() == "keep"
    assert convert_reference(path, tmp_path / "run", overwrite=True) == tmp_path / "run"
    assert not (tmp_path / "run" / "mine.txt").exists()


@pytest.mark.parametrize("data", ["cifar10-jpeg.zip", "/data/images", "cifar100"])
def test_our_own_export_converts_back_with_the_data_set_it_recorded(tmp_path, data):
    # export writes the run's own data set (a zip's file name, a folder's path) where the reference
    # writes Cifar10; converting that file back needs no --data
    from attncnn.models import build_model
    from attncnn.runs import Checkpoint, TrainConfig, write_checkpoint

    sizes = {"num_layers": 1, "dim": 8, "mlp_dim": 6, "num_heads": 2, "num_classes": 100 if data == "cifar100" else 10}
    model = build_model("quadratic", **sizes)
    meta = {"arch": model.arch, "model_config": dataclasses.asdict(model.config), "epoch": 3,
            "config": TrainConfig(preset="quadratic", model=sizes, data=data).to_dict()}
    write_checkpoint(tmp_path / "ours.safetensors", Checkpoint(model.state_dict(), None, {}, meta))
    out = export_reference(tmp_path / "ours.safetensors", tmp_path / "exported" / "final.checkpoint")
    run = convert_reference(out, tmp_path / "run")
    assert json.loads((run / "config.json").read_text())["data"] == data


def test_a_data_set_attncnn_does_not_read_is_refused_with_the_fix(tmp_path):
    cfg = reference_config("quadratic", dataset="ImageNet")
    path = save_reference(tmp_path / "ref", cfg, reference_state(cfg))
    _refused(tmp_path, path, r"trained on 'ImageNet', which attncnn does not read.*--data")
    assert json.loads((convert_reference(path, tmp_path / "run", data="x.zip") / "config.json").read_text())["data"] \
        == "x.zip"


def test_overwrite_refuses_a_folder_a_live_training_holds(tmp_path, capsys):
    from attncnn.cli import main
    from attncnn.runs import RunFolderError
    from attncnn.runs.lock import RunLock

    cfg = reference_config("quadratic")
    path = save_reference(tmp_path / "ref", cfg, reference_state(cfg))
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text('{"preset": "demo"}')
    training = RunLock.take(run)          # as a live `attncnn train` holds it (flock: per open file)
    try:
        with pytest.raises(RunFolderError, match=r"run folder .*run is in use: attncnn pid \d+ on host .* is "
                                                 r"training in it"):
            convert_reference(path, run, overwrite=True)
        assert main(["convert-reference", str(path), "--out", str(run), "--overwrite"]) == 2
        assert "is in use" in capsys.readouterr().err
        assert (run / "config.json").read_text() == '{"preset": "demo"}' and (run / "checkpoints").is_dir()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run")]
    finally:
        training.release()
    assert convert_reference(path, run, overwrite=True) == run           # once it is free
    assert json.loads((run / "config.json").read_text())["preset"] == "quadratic"
    (tmp_path / "empty").mkdir()
    assert sorted(p.name for p in convert_reference(path, tmp_path / "empty").iterdir()) == sorted(
        p.name for p in run.iterdir())


def test_a_training_that_starts_during_the_conversion_is_not_deleted_under_it(tmp_path, monkeypatch):
    import attncnn.reference.convert as convert
    from attncnn.runs import RunFolderError
    from attncnn.runs.lock import RunLock

    cfg = reference_config("quadratic")
    path = save_reference(tmp_path / "ref", cfg, reference_state(cfg))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"preset": "demo"}')
    started = []
    write = convert.write_checkpoint

    def write_while_a_training_starts(*args, **kwargs):
        started.append(RunLock.take(run))           # after the first check, before the folder is replaced
        return write(*args, **kwargs)

    monkeypatch.setattr(convert, "write_checkpoint", write_while_a_training_starts)
    try:
        with pytest.raises(RunFolderError, match="is in use"):
            convert_reference(path, run, overwrite=True)
    finally:
        started[0].release()
    assert (run / "config.json").read_text() == '{"preset": "demo"}'
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run")]
