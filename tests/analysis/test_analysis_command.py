"""``attncnn plot | inspect | report`` end to end on run folders made by the real trainer."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from attncnn.cli import main
from attncnn.models import count_parameters
from attncnn.runs import load_model

pytestmark = pytest.mark.slow        # trains four tiny runs once per session (a few seconds)


def test_plot_writes_every_figure_that_applies(runs, tmp_path, capsys):
    out = tmp_path / "figs"
    args = [str(runs[k]) for k in ("quadratic", "generalized", "learned", "content")]
    assert main(["plot", *args, "--out", str(out), "--average", "5"]) == 0
    printed = capsys.readouterr().out.split()
    # runs are named "<preset> seed <seed>"; the two demo runs share one, so the end of their paths tells them apart
    expected = {f"{stem}.{ext}" for ext in ("png", "pdf") for stem in (
        "demo-seed-42-quadratic-centers", "demo-seed-42-quadratic-layer2-evolution",
        "demo-seed-42-generalized-centers", "demo-seed-42-generalized-layer2-evolution", "learned-seed-42-maps",
        "learned-content-seed-42-maps-image0", "learned-content-seed-42-maps-average5", "accuracy")}
    assert {p.name for p in out.iterdir()} == expected
    assert all(p.stat().st_size > 1000 for p in out.iterdir())
    assert len([p for p in printed if p.endswith((".png", ".pdf"))]) == len(expected)


def test_a_content_models_maps_centre_on_the_grid_of_the_images_given(runs, make_tiny_data, tmp_path, capsys):
    # 16x16 images through pooling 4: a 4x4 grid, where the model's default (32x32 images) is 8x8
    small = make_tiny_data(10, 4, size=16)
    assert main(["plot", str(runs["content"]), "--figures", "maps,average", "--average", "3", "--formats", "png",
                 "--data", str(small), "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"learned-content-seed-42-maps-image0.png",
                                                   "learned-content-seed-42-maps-average3.png"}
    assert main(["plot", str(runs["content"]), "--figures", "maps", "--query", "4,4", "--data", str(small),
                 "--out", str(tmp_path)]) == 2
    assert "query token (4, 4) is outside the 4x4 token grid" in capsys.readouterr().err


def test_plot_options_and_errors(runs, tmp_path, capsys):
    ckpt = runs["quadratic"] / "checkpoints" / "epoch_0001.safetensors"
    assert main(["plot", str(ckpt), "--out", str(tmp_path), "--figures", "maps,centers", "--query", "1,2",
                 "--zoom", "2", "--formats", "png"]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"demo-seed-42-epoch_0001-maps.png",
                                                    "demo-seed-42-epoch_0001-centers.png"}
    assert main(["plot", str(runs["learned"]), "--out", str(tmp_path), "--figures", "bogus"]) == 2
    assert "unknown figure" in capsys.readouterr().err
    assert main(["plot", str(runs["quadratic"]), "--out", str(tmp_path), "--figures", "evolution",
                 "--layer", "7"]) == 2
    assert "layer" in capsys.readouterr().err


def test_plot_labels_runs_by_preset_and_seed_and_draws_every_curve(runs, tmp_path, monkeypatch, capsys):
    import attncnn.analysis.figures as figures

    curves: dict = {}
    real = figures.accuracy_figure
    monkeypatch.setattr(figures, "accuracy_figure", lambda c, **kw: curves.update(c) or real(c, **kw))
    options = ["--figures", "accuracy", "--formats", "png", "--out", str(tmp_path / "figs")]
    assert main(["plot", str(runs["quadratic"]), str(runs["learned"]), *options]) == 0
    assert set(curves) == {"demo seed 42", "learned seed 42"}
    # two folders both named seed0 holding runs of one preset and seed: the end of each path tells them apart
    a, b = tmp_path / "a" / "seed0", tmp_path / "b" / "seed0"
    shutil.copytree(runs["learned"], a)
    shutil.copytree(runs["learned"], b)
    curves.clear()
    assert main(["plot", str(a), str(b), *options]) == 0
    assert set(curves) == {"learned seed 42 (a/seed0)", "learned seed 42 (b/seed0)"}
    capsys.readouterr()
    assert main(["plot", str(a), str(a), *options]) == 2
    assert "the same run is given twice" in capsys.readouterr().err
    assert main(["plot", str(a), str(b), *options, "--labels", "x,x"]) == 2
    assert "--labels must be distinct" in capsys.readouterr().err
    shipped = Path(__file__).resolve().parents[2] / "results" / "mini"
    if (shipped / "learned-mini" / "seed0").is_dir():           # the newcomer's two shipped runs, both "seed0"
        curves.clear()
        assert main(["plot", str(shipped / "quadratic-mini" / "seed0"), str(shipped / "learned-mini" / "seed0"),
                     *options]) == 0
        assert set(curves) == {"quadratic-mini seed 0", "learned-mini seed 0"}


def test_inspect_text_and_json(runs, capsys):
    assert main(["inspect", str(runs["quadratic"])]) == 0
    text = capsys.readouterr().out
    assert text.startswith("demo seed 42 (epoch 2, quadratic)")       # the model, not the folder's name
    assert "layer 2 (quadratic)" in text and "alpha" in text and "2x2 grid" in text
    assert "most local head: layer" in text and "n.ent." in text and "over the grid side 8" in text
    assert main(["inspect", str(runs["content"]), "--json", "--images", "6"]) == 0
    result = json.loads(capsys.readouterr().out)           # stdout is pure JSON
    assert result["images"] == 6 and result["grid"] == [8, 8] and result["kind"] == "learned-content"
    assert len(result["layers"]) == 2 and len(result["layers"][0]["heads"]) == 4
    head = result["layers"][0]["heads"][0]
    assert 0 < head["peak"] <= 1 and head["distance"] > 0 and head["entropy"] > 0
    # the locality measures: over the grid side (8) and over log(number of keys)
    assert result["side"] == 8 and head["normalized_distance"] == pytest.approx(head["distance"] / 8)
    assert head["normalized_entropy"] == pytest.approx(head["entropy"] / math.log(64))
    layer = result["layers"][0]
    assert layer["min_distance"] == min(h["distance"] for h in layer["heads"])
    assert layer["local_heads"] == sum(h["distance"] <= 1.5 for h in layer["heads"])
    best = result["min_distance"]
    assert best["distance"] == min(h["distance"] for lay in result["layers"] for h in lay["heads"])
    assert result["layers"][best["layer"] - 1]["heads"][best["head"] - 1]["distance"] == best["distance"]
    assert main(["inspect", str(runs["generalized"]), "--json", "--margin", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "eigenvalues" in result["layers"][0]["heads"][0] and result["margin"] == 1


def test_report_rows(runs, tmp_path, capsys):
    out = tmp_path / "table.md"
    assert main(["report", str(runs["quadratic"]), str(runs["content"]), "--markdown", "--out", str(out),
                 "--batch-size", "4"]) == 0
    text = capsys.readouterr().out
    assert out.read_text() == text and text.startswith("| run |") and "selected on the test set" in text
    assert main(["report", str(runs["quadratic"]), str(runs["learned"]), "--json", "--no-speed"]) == 0
    rows = json.loads(capsys.readouterr().out)
    metrics = [json.loads(line) for line in (runs["quadratic"] / "metrics.jsonl").read_text().splitlines()]
    q = rows[0]
    assert q["parameters"] == count_parameters(load_model(runs["quadratic"])[0])
    assert q["last_accuracy"] == metrics[-1]["test_accuracy"] and q["epochs"] == 2
    assert q["best_accuracy"] == max(r["test_accuracy"] for r in metrics) and q["best_selected_on"] == "test"
    assert q["macs_per_image"] > 0 and q["train_images_per_s"] is None
    assert rows[1]["paper"]["params"] == "12.3 M" and rows[1]["paper"]["flops"] == "6.2 B"


def test_report_reproduces_the_preset_counts(capsys):
    assert main(["presets", "--json"]) == 0
    presets = {r["name"]: r["parameters"] for r in json.loads(capsys.readouterr().out)}
    args = ["report", "--json", "--no-speed"]
    for name in presets:
        args += ["--preset", name]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["preset"]: r["parameters"] for r in rows} == presets
    macs = {r["preset"]: r["macs_per_image"] / 1e9 for r in rows}
    # PAPER.md 5.2's estimates: 4.5 GMAC (quadratic), 10.3 GMAC (content), 0.56 GMAC (ResNet18).
    assert macs["quadratic"] == pytest.approx(4.5, rel=0.03)
    assert macs["learned-content"] == pytest.approx(10.3, rel=0.03)
    assert macs["resnet18"] == pytest.approx(0.56, rel=0.03)


def test_prune_reports_counts(runs, capsys):
    assert main(["prune", str(runs["generalized"]), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["heads_before"] == [4, 4] and result["pruned_per_layer"] == [0, 0]
    assert result["parameters_before"] == result["parameters_after"]
    # A huge minimum eigenvalue makes every head degenerate; each layer keeps its best one.
    assert main(["prune", str(runs["quadratic"]), "--min-eigenvalue", "1e9"]) == 0
    text = capsys.readouterr().out
    assert "pruned per layer: [3, 3]" in text and "parameters:" in text
