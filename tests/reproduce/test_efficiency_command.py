"""``attncnn reproduce efficiency`` end to end on a tiny data set: every cell trained for the same
seen images, the lean trim, the report's numbers equal to the runs', figures, evaluate on a cell."""

from __future__ import annotations

import json

import pytest

from attncnn.cli import main
from attncnn.reproduce.studies import EFFICIENCY

pytestmark = pytest.mark.slow        # four mini models x four cells of 40 tiny steps (~1-2 min on 2 cores)

MODELS = ("resnet18-mini", "quadratic-mini", "quadratic-conv-mini", "gpsa-mini")


@pytest.fixture(scope="module")
def grid(make_tiny_data, tmp_path_factory):
    data = make_tiny_data(40, 10, size=16)   # 3 classes: 120 train, 30 test images of 16x16
    out = tmp_path_factory.mktemp("grid") / "efficiency"
    # --no-compile: on a fresh machine the compile choice would compile each preset (tens of seconds on 2 cores)
    # to time runs of seconds; the choice has its own tests (tests/perf/test_compiling.py)
    args = ["reproduce", "efficiency", "--data", str(data), "--out", str(out), "--train-images", "120",
            "--batch-size", "6", "--only", ",".join(MODELS), "--no-progress", "--no-compile"]
    assert main(args) == 0
    return out, json.loads((out / "report.json").read_text())


def _records(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_every_cell_sees_the_same_images_and_the_report_gives_its_final_accuracy(grid):
    out, report = grid
    # --only trains part of the grid; the report still has every preset, the others listed as missing
    assert [row["preset"] for row in report["rows"]] == list(EFFICIENCY.rows)
    untrained = [p for p in EFFICIENCY.rows if p not in MODELS]
    assert sorted(report["missing"]) == sorted([f"{p} {cell} seed 0" for p in untrained
                                                for cell in ("10 %", "25 %", "100 %")]
                                               + [f"{p} 10 % seed 1" for p in untrained])   # the scarce cell's 2nd seed
    for row in report["rows"]:
        if row["preset"] in untrained:
            assert all(entry["accuracies"] == [] for entry in row["cells"].values())
            continue
        for cell, folder, epochs, every in (("10 %", "10pct", 20, 5), ("25 %", "25pct", 8, 2),
                                            ("100 %", "100pct", 2, 1)):
            entry = row["cells"][cell]
            assert (entry["epochs"], entry["seen_images"]) == (epochs, 240)
            seeds = [0, 1] if cell == "10 %" else [0]
            assert entry["seeds"] == seeds
            finals = []
            for seed in seeds:
                records = _records(out / row["preset"] / folder / f"seed{seed}")
                assert [r["epoch"] for r in records] == list(range(1, epochs + 1))
                tested = [r["epoch"] for r in records if "test_accuracy" in r]
                assert tested == list(range(every, epochs + 1, every))
                finals.append(records[-1]["test_accuracy"])
            assert entry["accuracies"] == finals
            # each seed's machine, from its epoch records: here one segment of this machine's CPU
            assert [[s["epochs"] for s in segments] for segments in entry["machines"]] == [[[1, epochs]]] * len(seeds)
            assert all(seg["machine"]["device"] == "cpu" for segments in entry["machines"] for seg in segments)
            assert entry["accuracy_mean"] == pytest.approx(sum(finals) / len(finals))
            assert (entry["accuracy_std"] is None) == (len(finals) == 1)


def test_the_report_says_where_each_cell_trained(grid):
    out, report = grid
    md = (out / "report.md").read_text()
    trained = [(row["preset"], cell, seed) for row in report["rows"] for cell, entry in row["cells"].items()
               for seed in entry["seeds"]]
    lines = [line for line in md.split("## Machines")[1].split("## Figures")[0].splitlines() if line.startswith("| ")]
    assert len(lines) == len(trained) + 1                       # the header and one line per seed of a cell
    assert all(" thread" in line and ", torch " in line and "(epochs 1-" in line for line in lines[1:])


def test_claims_carry_the_measured_gains_and_gates(grid):
    out, report = grid
    rows = {row["preset"]: row["cells"] for row in report["rows"]}
    claims = {c["claim"]: c["values"] for c in report["claims"]}
    conv = next(v for k, v in claims.items() if k.startswith("starting attention") and "quadratic" in k)
    gain = rows["quadratic-conv-mini"]["10 %"]["accuracy_mean"] - rows["quadratic-mini"]["10 %"]["accuracy_mean"]
    assert conv.startswith(f"10 % {100 * gain:+.2f}")
    scarce = next(v for k, v in claims.items() if k.startswith("precondition"))
    train = sum(_records(out / "quadratic-mini" / "10pct" / f"seed{s}")[-1]["train_accuracy"] for s in (0, 1)) / 2
    cost = rows["quadratic-mini"]["100 %"]["accuracy_mean"] - rows["quadratic-mini"]["10 %"]["accuracy_mean"]
    gap = train - rows["quadratic-mini"]["10 %"]["accuracy_mean"]
    assert f"quadratic-mini: 100 % vs 10 % {100 * cost:+.2f}, train - test {100 * gap:+.2f}" in scarce
    assert scarce.count("train - test") == len(MODELS)
    gates = next(v for k, v in claims.items() if k.startswith("GPSA's early layers"))
    assert gates.count("L6") == 3 and "L1 0." in gates


def test_figures_and_evaluate_on_a_cell(grid, make_tiny_data, capsys):
    out, report = grid
    folder = out / "gpsa-mini" / "10pct" / "seed0"
    assert {p.name for p in (out / "figures").iterdir()} == {
        "efficiency-accuracy.png", "efficiency-gates.png",
        *(f"efficiency-{kind}-{pct}pct.png" for kind in ("seen", "distance") for pct in (10, 25, 100))}
    capsys.readouterr()
    assert main(["evaluate", str(folder), "--data", str(make_tiny_data(40, 10, size=16)), "--json"]) == 0
    accuracy = json.loads(capsys.readouterr().out)["test_accuracy"]
    assert accuracy == pytest.approx(report["rows"][3]["cells"]["10 %"]["accuracies"][0], abs=1e-9)
