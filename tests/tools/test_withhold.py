"""A finished run shipped without its weights: the record the tool's ``withhold_weights`` writes, the
weights moved (never deleted), and every reader of the weights in the package refusing the run with a
message that says so and how to train it again, while reports still read its records."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from withhold import withhold_weights

import attncnn
from attncnn.analysis.runs import open_run
from attncnn.cli import main
from attncnn.models import count_parameters
from attncnn.perf import make_plan
from attncnn.runs import (PREDICTIONS_FILE, WITHHELD_FILE, RunFolderError, load_model, read_metadata, read_withheld,
                          resolve_config)
from attncnn.training import RunOptions, train

RETRAIN = "attncnn reproduce demo-suite --only demo --seeds 0"


@pytest.fixture(scope="module")
def trained(make_tiny_data, tmp_path_factory):
    """A finished 1-epoch demo run (width 16) with its prediction record, and its data set."""
    root = tmp_path_factory.mktemp("withheld")
    data = make_tiny_data(10, 4)
    config = resolve_config("demo", data=str(data), epochs=1, batch_size=10, model={"dim": 16, "mlp_dim": 16})
    out = root / "run"
    train(config, out, make_plan(config, RunOptions(data_dir=str(root / "cache"), device="cpu")), progress=False)
    assert main(["evaluate", str(out), "--data", str(data), "--predictions", str(out / PREDICTIONS_FILE)]) == 0
    return out, data


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run to withhold."""
    copy = tmp_path / "results" / "suite" / "demo" / "seed0"
    shutil.copytree(trained[0], copy)
    return copy


def test_the_record_says_what_the_weights_were_and_they_move_whole(run, tmp_path):
    last = run / "checkpoints" / "last.safetensors"
    digest, size, metadata = hashlib.sha256(last.read_bytes()).hexdigest(), last.stat().st_size, read_metadata(last)
    held = sorted(p.name for p in (run / "checkpoints").iterdir())
    target = tmp_path / "kept" / "demo" / "seed0" / "checkpoints"
    record = withhold_weights(run, retrain=RETRAIN, move_to=target, extra={"final_layers": [{"layer": 1}]})
    assert record == read_withheld(run) == json.loads((run / WITHHELD_FILE).read_text())
    assert (record["file"], record["bytes"], record["sha256"]) == ("checkpoints/last.safetensors", size, digest)
    assert record["metadata"] == metadata and record["weights_dtype"] == "float32"
    assert record["retrain"] == RETRAIN and record["final_layers"] == [{"layer": 1}]
    assert not (run / "checkpoints").exists() and sorted(p.name for p in target.iterdir()) == held
    assert hashlib.sha256((target / "last.safetensors").read_bytes()).hexdigest() == digest
    # the same call again: already withheld, nothing changes
    assert withhold_weights(run, retrain="other", move_to=tmp_path / "elsewhere") == record
    assert not (tmp_path / "elsewhere").exists()


def test_a_reader_of_the_weights_says_they_were_withheld_and_how_to_train_them(run, tmp_path, capsys):
    withhold_weights(run, retrain=RETRAIN, move_to=tmp_path / "kept")
    for read in (lambda: load_model(run), lambda: attncnn.load_model(run), lambda: open_run(run)):
        with pytest.raises(FileNotFoundError, match=f"{run} was shipped without its weights") as err:
            read()
        assert WITHHELD_FILE in str(err.value) and str(err.value).endswith(RETRAIN)
    assert main(["evaluate", str(run)]) != 0
    assert "was shipped without its weights" in capsys.readouterr().err
    # the model's name is not found, with the reason first (pretrained looks for <root>/<suite>/<name>/seed<N>)
    with pytest.raises(FileNotFoundError, match="was shipped without its weights") as err:
        attncnn.pretrained("demo", root=run.parents[2])
    assert RETRAIN in str(err.value)


def test_reports_open_the_run_from_its_records(run, trained, tmp_path):
    before = open_run(run)
    withhold_weights(run, retrain=RETRAIN, move_to=tmp_path / "kept")
    opened = open_run(run, withheld=True)
    assert opened.model is None and opened.checkpoint is None and opened.withheld == read_withheld(run)
    assert opened.metadata == before.metadata and opened.metrics == before.metrics and opened.name == before.name
    assert opened.kind == before.kind == "quadratic"
    # the architecture, freshly made, counts what the trained network counts
    assert count_parameters(opened.network()) == count_parameters(before.model) == opened.metadata["parameters"]
    # a run with its weights opens as before, the flag notwithstanding
    assert open_run(trained[0], withheld=True).model is not None


def test_what_cannot_be_withheld_is_refused_and_nothing_moves(run, tmp_path):
    with pytest.raises(ValueError, match="say how the withheld weights can be trained again"):
        withhold_weights(run, retrain=" ", move_to=tmp_path / "a")
    with pytest.raises(ValueError, match=r"extra keys \['sha256'\] are the record's own"):
        withhold_weights(run, retrain=RETRAIN, move_to=tmp_path / "a", extra={"sha256": "x"})
    (tmp_path / "taken").mkdir()
    with pytest.raises(ValueError, match="taken exists"):
        withhold_weights(run, retrain=RETRAIN, move_to=tmp_path / "taken")
    (run / PREDICTIONS_FILE).rename(tmp_path / PREDICTIONS_FILE)
    with pytest.raises(ValueError, match=f"has no {PREDICTIONS_FILE}: record .*attncnn evaluate {run}"):
        withhold_weights(run, retrain=RETRAIN, move_to=tmp_path / "a")
    (tmp_path / PREDICTIONS_FILE).rename(run / PREDICTIONS_FILE)
    (run / "finished.json").unlink()
    with pytest.raises(ValueError, match="is not finished"):
        withhold_weights(run, retrain=RETRAIN, move_to=tmp_path / "a")
    assert (run / "checkpoints" / "last.safetensors").is_file() and not (run / WITHHELD_FILE).exists()
    assert not (tmp_path / "a").exists()


def test_a_damaged_record_is_named(run, tmp_path):
    withhold_weights(run, retrain=RETRAIN, move_to=tmp_path / "kept")
    record = json.loads((run / WITHHELD_FILE).read_text())
    (run / WITHHELD_FILE).write_text(json.dumps({**record, "bytes": "many"}))
    with pytest.raises(RunFolderError, match="'bytes' should be a int, found 'many'"):
        read_withheld(run)
    (run / WITHHELD_FILE).write_text("{")
    with pytest.raises(RunFolderError, match="unreadable"):
        read_withheld(run)


def test_a_move_cut_short_leaves_loadable_weights_and_the_same_call_finishes_it(run, tmp_path, monkeypatch):
    def cut_short(*args):
        raise OSError("disk full")

    monkeypatch.setattr(shutil, "move", cut_short)
    with pytest.raises(OSError, match="disk full"):
        withhold_weights(run, retrain=RETRAIN, move_to=tmp_path / "kept")
    monkeypatch.undo()
    assert read_withheld(run) is not None and load_model(run)[1]["epoch"] == 1     # the record only speaks when
    withhold_weights(run, retrain=RETRAIN, move_to=tmp_path / "kept")               # the weights are gone
    assert not (run / "checkpoints").exists() and (tmp_path / "kept" / "last.safetensors").is_file()


def test_weights_are_withheld_by_row_so_a_grid_variant_is_its_own(tmp_path, monkeypatch):
    import withhold

    from attncnn.reproduce.running.runner import Job

    monkeypatch.setattr(withhold, "job_state", lambda job: "finished")
    jobs = [Job("convit-mini", 0, tmp_path / row / "10pct" / "seed0", cell="10 %", row=row)
            for row in ("convit-mini", "convit-mini-random")]
    assert [job.row for job in withhold.withholdable(jobs, ["convit-mini-random"])] == ["convit-mini-random"]
    assert [job.row for job in withhold.withholdable(jobs, ["convit-mini"])] == ["convit-mini"]
