"""``attncnn reproduce`` end to end on a tiny data set: train, trim, report, figures, viewer, resume."""

from __future__ import annotations

import json
import shutil

import pytest
from ship import main as ship

from attncnn.analysis.viewer.decode import read_viewer
from attncnn.cli import main
from attncnn.runs import PREDICTIONS_FILE, WITHHELD_FILE, load_checkpoint, read_withheld

pytestmark = pytest.mark.slow        # trains the five mini models for one step each (~1 min on 2 cores)


@pytest.fixture(scope="module")
def suite(make_tiny_data, tmp_path_factory):
    data = make_tiny_data(40, 10, size=16)   # 3 classes: 120 train, 30 test images of 16x16
    out = tmp_path_factory.mktemp("suite") / "mini"
    # --no-compile: on a fresh machine the compile choice would compile each preset (tens of seconds on 2 cores)
    # to time runs of seconds; the choice has its own tests (tests/perf/test_compiling.py)
    args = ["reproduce", "mini", "--data", str(data), "--out", str(out), "--epochs", "1", "--seeds", "0",
            "--no-progress", "--no-compile"]
    assert main(args) == 0
    # trimmed for committing as the project does (tools/ship.py), which writes the report again; the figures
    # drawn before from periodic checkpoints the trim drops go first, as they would not be committed
    shutil.rmtree(out / "figures")
    assert ship([str(out), "--finished-only", "--data", str(data), "--seeds", "0", "--epochs", "1"]) == 0
    return out, args


def test_report_has_every_row_and_the_papers_numbers(suite):
    out, _ = suite
    report = json.loads((out / "report.json").read_text())
    rows = {row["preset"]: row for row in report["rows"]}
    assert list(rows) == ["quadratic-mini", "learned-mini", "resnet18-mini", "quadratic-generalized-mini",
                          "learned-content-mini"]
    for row in rows.values():
        assert row["seeds"] == [0] and row["epochs"] == 1 and 0 <= row["accuracy_mean"] <= 1
        assert row["accuracy_std"] is None and row["paper_flops"] > 0 and row["macs"] > 0
    assert rows["quadratic-mini"]["parameters"] == 349_164 - 7 * 65      # 3 classes instead of 10
    # the precision column reads each run's machine.json (the recipe does not hold it)
    trained = json.loads((out / "quadratic-mini" / "seed0" / "machine.json").read_text())["segments"][0]["precision"]
    assert trained in ("fp32", "bf16") and {row["precision"] for row in rows.values()} == {trained}
    assert rows["learned-content-mini"]["paper"]["accuracy"] == 0.871
    assert report["missing"] == []
    text = (out / "report.md").read_text()
    assert "| quadratic-mini |" in text and "87.1 / 29.5 M / 15 B" in text
    assert {c["claim"].split(" ")[0] for c in report["claims"]} >= {"early-layer", "deeper", "learned", "adding",
                                                                    "full-covariance"}
    # locality: every attention model, from its weights; the content model on the 30 test images there are
    assert set(report["locality"]) == set(rows) - {"resnet18-mini"} and "locality" not in rows["resnet18-mini"]
    content = report["locality"]["learned-content-mini"][0]
    assert content["seed"] == 0 and content["images"] == 30 and report["locality"]["quadratic-mini"][0]["images"] == 0
    best = rows["learned-content-mini"]["locality"]
    assert best["mean"] == content["min_distance"]["distance"] and best["std"] is None
    assert best["mean"] == min(h["distance"] for lay in content["layers"] for h in lay["heads"])
    assert "## Locality per layer after training" in text and f"| {best['mean']:.2f} (" in text


def test_every_figure_and_the_viewer_are_written(suite):
    out, _ = suite
    names = {p.name for p in (out / "figures").iterdir()}
    assert names == {"fig2-accuracy.png", "fig4-quadratic-mini-centers.png", "fig3-quadratic-mini-layer1-epochs.png",
                     "fig3-quadratic-mini-layer4-epochs.png", "fig4-quadratic-generalized-mini-centers.png",
                     "fig5-learned-mini-maps.png", "fig6-learned-content-mini-image0.png",
                     "fig6-learned-content-mini-average30.png", "distances-quadratic-mini.png",
                     "distances-learned-mini.png", "distances-quadratic-generalized-mini.png",
                     "locality-quadratic-mini.png", "locality-learned-mini.png",
                     "locality-quadratic-generalized-mini.png", "locality-learned-content-mini.png"}
    assert (out / "viewer.html").stat().st_size > 10_000


def test_the_viewer_page_holds_the_chosen_images_and_no_average_by_default(suite, tmp_path):
    out, args = suite
    runs = read_viewer(out / "viewer.html").manifest["runs"]
    assert [r["preset"] for r in runs] == ["quadratic-mini", "learned-mini", "quadratic-generalized-mini",
                                           "learned-content-mini"]                 # no ResNet: no attention
    assert all([i["key"] for i in r["images"]] == ["2"] and r["average"] == 0 for r in runs)
    # the paper website's choice on request: more images, and the content model's average
    copy = tmp_path / "mini"
    shutil.copytree(out, copy)
    assert main(["reproduce", "mini", "--data", args[args.index("--data") + 1], "--out", str(copy), "--seeds", "0",
                 "--report-only", "--viewer-images", "2,3", "--viewer-average", "5", "--no-progress"]) == 0
    runs = {r["preset"]: r for r in read_viewer(copy / "viewer.html").manifest["runs"]}
    assert [i["key"] for i in runs["learned-content-mini"]["images"]] == ["2", "3", "average"]
    assert runs["learned-content-mini"]["average"] == 5 and runs["learned-mini"]["average"] == 0


def test_trim_keeps_what_a_user_needs(suite):
    out, _ = suite
    kept = {p.relative_to(out / "quadratic-mini" / "seed0").as_posix()
            for p in (out / "quadratic-mini" / "seed0").rglob("*") if p.is_file()}
    assert kept == {"config.json", "metrics.jsonl", "finished.json", "machine.json", "checkpoints/last.safetensors",
                    "checkpoints/epoch_0001.safetensors"}
    learned = {p.name for p in (out / "learned-mini" / "seed0").rglob("*") if p.is_file()}
    assert learned == {"config.json", "metrics.jsonl", "finished.json", "machine.json", "last.safetensors"}
    # weights only: a finished run is not resumed, and the optimiser state would double its size
    for folder in (out / "quadratic-mini" / "seed0", out / "learned-mini" / "seed0"):
        checkpoint = load_checkpoint(folder / "checkpoints" / "last.safetensors")
        assert checkpoint.optimizer_state is None and checkpoint.model_state


def test_trimming_again_keeps_a_prediction_record_and_drops_other_files(suite, tmp_path):
    from trim import trim_run

    from attncnn.reproduce import get_suite, plan
    out, _ = suite
    copy = tmp_path / "mini"
    shutil.copytree(out / "learned-mini", copy / "learned-mini")
    job = plan(get_suite("mini"), copy, seeds=(0,), only=("learned-mini",), epochs=1)[0]
    (job.folder / "predictions.json").write_text("{}")           # attncnn evaluate --predictions, made once
    (job.folder / "notes.txt").write_text("scratch")
    trim_run(job.folder, keep_epochs=False)
    assert (job.folder / "predictions.json").is_file() and not (job.folder / "notes.txt").exists()


def test_runs_shipped_without_their_weights_keep_their_rows_and_their_attention(suite, tmp_path, capsys):
    out, args = suite
    data = args[args.index("--data") + 1]
    copy, kept = tmp_path / "mini", tmp_path / "kept"
    shutil.copytree(out, copy)
    withhold = [str(copy), "--data", data, "--no-viewer", "--seeds", "0", "--epochs", "1", "--without-weights",
                "learned-content-mini,quadratic-mini", "--weights-to", str(kept)]
    folders = {p: copy / p / "seed0" for p in ("learned-content-mini", "quadratic-mini")}
    assert main(["evaluate", str(folders["learned-content-mini"]), "--data", data, "--predictions",
                 str(folders["learned-content-mini"] / PREDICTIONS_FILE)]) == 0
    capsys.readouterr()
    # one of them has no prediction record yet: refused before anything moves
    assert ship(withhold) == 2
    assert f"{folders['quadratic-mini']} has no {PREDICTIONS_FILE}" in capsys.readouterr().err
    assert all((f / "checkpoints").is_dir() for f in folders.values()) and not kept.exists()
    assert main(["evaluate", str(folders["quadratic-mini"]), "--data", data, "--predictions",
                 str(folders["quadratic-mini"] / PREDICTIONS_FILE)]) == 0
    assert ship(withhold) == 0
    assert "learned-content-mini seed 0: shipped without its weights" in capsys.readouterr().out
    for preset, folder in folders.items():
        assert {p.name for p in folder.iterdir()} == {"config.json", "metrics.jsonl", "finished.json", "machine.json",
                                                      PREDICTIONS_FILE, WITHHELD_FILE}
        assert (kept / preset / "seed0" / "checkpoints" / "last.safetensors").is_file()
        retrain = read_withheld(folder)["retrain"]
        assert retrain.startswith(f"attncnn reproduce mini --only {preset} --seeds 0 --data <its data set> "
                                  "--out <a new folder> (1 epoch: ")
    before, after = (json.loads((o / "report.json").read_text()) for o in (out, copy))
    assert after["rows"] == before["rows"]                # accuracy, counts, FLOPs: from the records and the config
    # the attention per layer: measured from the weights before they went, as the first report did
    assert after["layers"].keys() == before["layers"].keys()
    for preset, layers in before["layers"].items():
        assert (after["layers"][preset] is None) == (layers is None)
        for now, then in zip(after["layers"][preset] or [], layers or [], strict=True):
            assert now == pytest.approx(then)
    assert after["figures"] == before["figures"]          # those drawn from the weights: the files drawn before
    assert after["locality"] == before["locality"]        # measured before the weights went, kept in the record
    assert read_withheld(folders["learned-content-mini"])["locality"] == before["locality"]["learned-content-mini"][0]
    # the same command again, and a trim: nothing changes, nothing is lost
    assert ship(withhold) == 0 and ship(withhold[:-4]) == 0
    assert json.loads((copy / "report.json").read_text())["rows"] == before["rows"]
    assert all(read_withheld(f) is not None for f in folders.values())


def test_evaluating_a_shipped_run_gives_the_reported_accuracy(suite, capsys):
    out, args = suite
    report = json.loads((out / "report.json").read_text())
    capsys.readouterr()
    for row in report["rows"][:3]:
        # trimmed folders store their data set's name, not its local path: --data says where it is here
        assert main(["evaluate", str(out / row["preset"] / "seed0"), "--data", args[args.index("--data") + 1],
                     "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["test_accuracy"] == pytest.approx(row["accuracy_mean"], abs=1e-9)


def test_a_second_call_trains_nothing_and_an_unfinished_run_is_resumed(suite, tmp_path, caplog):
    out, args = suite
    with caplog.at_level("INFO", logger="attncnn.reproduce"):
        assert main(args + ["--no-viewer"]) == 0
    assert "quadratic-mini seed 0: finished already" in caplog.text and "resuming" not in caplog.text
    # An untrimmed run whose finished.json was never written (the machine went away at the very
    # end) resumes from its last checkpoint; trimmed folders hold weights only and are never resumed.
    part = ["reproduce", "mini", "--data", args[args.index("--data") + 1], "--out", str(tmp_path / "mini"),
            "--epochs", "1", "--seeds", "0", "--only", "resnet18-mini", "--no-progress", "--no-viewer"]
    assert main(part) == 0
    folder = tmp_path / "mini" / "resnet18-mini" / "seed0"
    metrics = (folder / "metrics.jsonl").read_text()
    (folder / "finished.json").unlink()
    caplog.clear()
    with caplog.at_level("INFO", logger="attncnn.reproduce"):
        assert main(part) == 0
    assert "resnet18-mini seed 0: resuming" in caplog.text
    assert (folder / "finished.json").is_file() and (folder / "metrics.jsonl").read_text() == metrics


def test_dry_run_prints_commands_and_estimates(tmp_path, capsys):
    assert main(["reproduce", "mini", "--dry-run", "--only", "resnet18-mini", "--out", str(tmp_path),
                 "--epochs", "2"]) == 0
    text = capsys.readouterr().out
    assert f"attncnn train --preset resnet18-mini --seed 0 --data cifar10 --out {tmp_path}/resnet18-mini/seed0 " \
           "--epochs 2" in text
    assert "min/epoch" in text and "# total ~" in text
    assert not any(tmp_path.iterdir())                     # a dry run writes nothing


def test_a_dry_run_says_whether_the_run_compiles_by_the_rule_or_as_asked(tmp_path, capsys):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    lines = {}
    for epochs, flags in (("2", ()), ("60", ()), ("2", ("--compile",)), ("60", ("--no-compile",))):
        assert main(["reproduce", "mini", "--dry-run", "--only", "resnet18-mini", "--seeds", "0", "--out",
                     str(tmp_path / "m"), "--epochs", epochs, "--data-dir", str(data_dir), *flags]) == 0
        (lines[epochs, flags],) = [line for line in capsys.readouterr().out.splitlines() if "s/step" in line]
    # the rule: a CPU ResNet compiles from ten minutes of eager training (1,000 steps: about 2 min; 30,000: hours)
    assert lines["2", ()].endswith("; eager)")
    assert lines["60", ()].endswith("; compiled by the rule, estimated at the eager step)")
    assert lines["2", ("--compile",)].endswith("; compiled, estimated at the eager step)")
    assert lines["60", ("--no-compile",)].endswith("; eager)")
    assert not (tmp_path / "m").exists()


def test_bad_options_are_named(tmp_path, capsys):
    assert main(["reproduce", "mini", "--out", str(tmp_path), "--report-only"]) == 2
    assert "no finished run" in capsys.readouterr().err
    for flag in ("--ship", "--trim"):                   # how this project commits runs: tools/ship.py, not the package
        with pytest.raises(SystemExit, match="2"):
            main(["reproduce", "mini", "--out", str(tmp_path), flag])
        assert f"unrecognized arguments: {flag}" in capsys.readouterr().err
    assert main(["reproduce", "mini", "--out", str(tmp_path), "--epochs", "0"]) == 2
    assert "--epochs must be >= 1" in capsys.readouterr().err
    # refused before any training, not when the page is written hours later
    assert main(["reproduce", "mini", "--out", str(tmp_path), "--viewer-images", "2,x"]) == 2
    assert "--viewer-images must be comma-separated test image indices" in capsys.readouterr().err
    assert main(["reproduce", "mini", "--out", str(tmp_path), "--viewer-average", "-1"]) == 2
    assert "--viewer-average must be >= 0" in capsys.readouterr().err
    # a precision that nothing would run at is refused, not ignored
    assert main(["reproduce", "mini", "--out", str(tmp_path), "--report-only", "--precision", "fp32"]) == 2
    assert "--report-only trains nothing" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_dry_run_skips_finished_runs_and_says_when_all_are(suite, capsys, monkeypatch):
    from attncnn.reproduce.running import estimate

    monkeypatch.setattr(estimate, "cpu_load", lambda: 0.0)           # an idle machine: no warning
    out, _ = suite
    assert main(["reproduce", "mini", "--dry-run", "--only", "resnet18-mini", "--seeds", "0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"the 1 run(s) of mini under {out} are all finished: nothing to train" in text
    assert "attncnn reproduce mini --dry-run --out runs/mini" in text and "# total" not in text
    # a finished run beside one still to train: the finished one is listed as skipped, the other timed
    assert main(["reproduce", "mini", "--dry-run", "--only", "resnet18-mini", "--seeds", "0,1", "--out",
                 str(out)]) == 0
    text = capsys.readouterr().out
    assert f"# resnet18-mini seed 0: finished in {out}/resnet18-mini/seed0, skipped" in text
    assert "--seed 1 " in text and "# total ~" in text and "busy" not in text


def test_dry_run_warns_when_the_cpu_was_busy(tmp_path, capsys, monkeypatch):
    from attncnn.reproduce.running import estimate

    monkeypatch.setattr(estimate, "cpu_load", lambda: 1000.0)        # far more runnable processes than cores
    assert main(["reproduce", "mini", "--dry-run", "--only", "resnet18-mini", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "# warning: the CPU was busy while the steps were timed (load average 1000.0 on" in text
    assert "Run the dry run again when the machine is idle" in text


def test_the_busy_cpu_rule():
    from attncnn.reproduce.running.estimate import busy_cpu

    assert busy_cpu([0.3, 1.2], cores=2) is None                    # this process alone
    assert busy_cpu([None, None], cores=2) is None                  # no load average on this system
    assert busy_cpu([1.0, 3.1], cores=2).startswith("warning: the CPU was busy")   # a 2-thread job beside it
    assert busy_cpu([4.0], cores=16) is None


def test_a_dry_run_times_the_data_sets_images_and_counts_its_images(make_tiny_data, tmp_path, capsys, monkeypatch):
    from attncnn.reproduce.running import estimate, runner

    timed = []

    def fake_time_steps(model, images, labels, **kwargs):
        timed.append((tuple(images.shape), model.config.num_classes, int(labels.max()) < 3))
        return {"step_seconds": 2.0, "infer_seconds": 0.5}

    monkeypatch.setattr(estimate, "time_steps", fake_time_steps)
    data = make_tiny_data(40, 10, size=16)            # 3 classes: 120 train, 30 test images of 16x16
    common = ["reproduce", "mini", "--dry-run", "--only", "quadratic-mini", "--seeds", "0", "--out",
              str(tmp_path / "m"), "--epochs", "2", "--no-compile", "--batch-size", "10", "--data", str(data)]
    assert main(common) == 0
    text = capsys.readouterr().out
    assert timed == [((10, 3, 16, 16), 3, True)]
    assert f"# {data.name}: 120 training and 30 test images of 16x16, 3 classes" in text
    # 12 steps of 2 s an epoch and a test pass of 3 batches of 0.5 s after each: 25.5 s an epoch, 51 s in all
    assert "# 2.00 s/step, ~0.4 min/epoch, ~0.01 h (" in text and "images of 16x16;" in text
    found = estimate.estimate_job(runner.Job("quadratic-mini", 0, tmp_path / "m" / "q"),
                                  runner.TrainOptions(data=str(data), compile=False, epochs=2, batch_size=10))
    assert (found.epoch_seconds, found.total_seconds) == (25.5, 51.0)
    assert not (tmp_path / "m").exists()
    # a data set the network cannot take is refused with the network's own message, as training refuses it
    odd = make_tiny_data(2, 1, size=15)
    assert main([*common[:-2], "--data", str(odd)]) == 2
    assert "cannot take 3x15x15 images" in capsys.readouterr().err
    assert main([*common[:-2], "--data", str(tmp_path / "nowhere")]) == 2
    assert "unknown data set" in capsys.readouterr().err
