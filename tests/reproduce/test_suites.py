"""Suites, job plans and job states of ``attncnn reproduce`` (no training)."""

from __future__ import annotations

import json

import pytest

from attncnn.analysis.report import macs_per_image, paper_flops_per_image
from attncnn.models import build_model, get_preset
from attncnn.reproduce import SUITES, Job, get_suite, job_state, plan
from attncnn.reproduce.request import parse_seeds
from attncnn.reproduce.running.runner import TrainOptions, train_command


def test_every_suite_preset_exists_and_names_a_paper_row():
    for suite in SUITES.values():
        for preset in suite.rows:
            assert get_preset(preset).name == preset
            assert suite.paper_names[preset] in ("quadratic", "quadratic-generalized", "learned",
                                                 "learned-content", "resnet18")
        assert suite.evolution_preset in suite.rows


def test_plan_trains_every_model_once_before_further_seeds(tmp_path):
    jobs = plan(get_suite("mini"), tmp_path)
    labels = [(j.preset, j.seed) for j in jobs]
    assert labels == [("quadratic-mini", 0), ("learned-mini", 0), ("resnet18-mini", 0),
                      ("quadratic-generalized-mini", 0), ("learned-content-mini", 0),
                      ("quadratic-mini", 1), ("learned-mini", 1), ("quadratic-mini", 2), ("learned-mini", 2)]
    assert jobs[0].folder == tmp_path / "quadratic-mini" / "seed0"
    jobs = plan(get_suite("mini"), tmp_path, seeds=(3, 4), only=("learned-mini", "resnet18-mini"))
    assert [(j.preset, j.seed) for j in jobs] == [("learned-mini", 3), ("resnet18-mini", 3),
                                                  ("learned-mini", 4), ("resnet18-mini", 4)]


def test_plan_and_seeds_reject_bad_input(tmp_path):
    with pytest.raises(ValueError, match="quadratic.*not in suite 'mini'"):
        plan(get_suite("mini"), tmp_path, only=("quadratic",))
    with pytest.raises(ValueError, match="unknown suite"):
        get_suite("huge")
    assert parse_seeds("0, 1,2") == (0, 1, 2) and parse_seeds(None) is None
    for bad in ("a", "1,1", "-1", ""):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


def _config(folder, preset, seed):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"preset": preset, "seed": seed, "epochs": 1}))


def test_job_state_reads_the_folder_and_refuses_another_run(tmp_path):
    job = Job("quadratic-mini", 0, tmp_path / "q" / "seed0")
    assert job_state(job) == "new"
    _config(job.folder, "quadratic-mini", 0)
    assert job_state(job) == "interrupted"
    (job.folder / "finished.json").write_text("{}")
    assert job_state(job) == "finished"
    other = Job("quadratic-mini", 1, tmp_path / "x")
    _config(other.folder, "learned-mini", 1)
    with pytest.raises(ValueError, match="holds a run of learned-mini seed 1, not quadratic-mini seed 1"):
        job_state(other)
    stray = Job("quadratic-mini", 2, tmp_path / "stray")
    stray.folder.mkdir()
    (stray.folder / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no config.json"):
        job_state(stray)


def test_train_command_is_the_equivalent_train_call(tmp_path):
    job = Job("learned-mini", 2, tmp_path / "learned-mini" / "seed2")
    text = train_command(job, TrainOptions(data="my data.zip", epochs=1))
    assert text == (f"attncnn train --preset learned-mini --seed 2 --data 'my data.zip' --out {job.folder} "
                    "--epochs 1")
    kernels = TrainOptions(data="d", device="cuda", compile_mode="reduce-overhead", fused_optimizer=True)
    assert train_command(job, kernels).endswith("--device cuda --compile-mode reduce-overhead --fused-optimizer")


@pytest.mark.parametrize("preset,paper", [("quadratic", "6.2"), ("learned", "6.2"), ("learned-content", "15.0"),
                                          ("resnet18", "0.56")])
def test_paper_flops_convention_gives_the_papers_table(preset, paper):
    # PAPER.md 5.1: 6.2 B / 6.2 B / 15 B / 0.56 B, from thop-style counts we reconstruct
    value = paper_flops_per_image(build_model(preset)) / 1e9
    assert f"{value:.{len(paper.split('.')[1])}f}" == paper


@pytest.mark.parametrize("preset,impls", [("learned-content-mini", ["explicit-half", "sdpa", "bilinear",
                                                                     "explicit-onehot"]),
                                          ("gpsa-mini", ["explicit-half", "sdpa"])])
def test_content_models_are_counted_on_their_written_out_map_whatever_path_they_took(preset, impls):
    """Table 1's counts of a content model do not depend on the path its machine measured fastest
    (the one-hot paths call the query map through its weight, and have H + W more columns; the
    bilinear path calls neither the query nor the key map)."""
    explicit = build_model(preset, impl="explicit")
    for impl in impls:
        model = build_model(preset, impl=impl)
        assert paper_flops_per_image(model) == paper_flops_per_image(explicit), impl
        assert macs_per_image(model) == macs_per_image(explicit), impl


@pytest.mark.parametrize("impl", ["dense", "separable", "folded"])
def test_paper_flops_and_macs_do_not_depend_on_the_attention_path(impl):
    """The folded path uses the output map's weight without calling the module: the counts must not
    lose it (learned-mini trained with it once showed 0.063 instead of 0.177 paper-style GFLOPS)."""
    model = build_model("learned-mini", impl=impl)
    assert paper_flops_per_image(model) == paper_flops_per_image(build_model("learned-mini", impl="dense"))
    assert macs_per_image(model) == macs_per_image(build_model("learned-mini", impl="dense"))
    assert model.config.impl == impl and {m.impl for m in model.modules() if hasattr(m, "impl")} == {impl}


def test_paper_flops_of_a_resnet_are_its_plain_macs():
    model = build_model("resnet18-mini")
    assert paper_flops_per_image(model) == macs_per_image(model)


def test_the_report_covers_every_run_folder_of_a_study_run_in_parts_lowest_seed_first(tmp_path):
    from attncnn.reproduce import STUDIES
    from attncnn.reproduce.running.runner import study_jobs

    out = tmp_path / "mini"
    for seed in (0, 3):                      # seed 0 (a default) and seed 3 trained by earlier calls
        (out / "resnet18-mini" / f"seed{seed}").mkdir(parents=True)
    (out / "quadratic-mini" / "seed2").mkdir(parents=True)
    jobs = study_jobs(STUDIES["mini"], out, seeds=(1,), epochs=None)      # this call: --seeds 1
    by_row = {}
    for job in jobs:
        by_row.setdefault(job.preset, []).append(job.seed)
    # this call's seed for every preset, and every folder there is, each row's seeds ascending
    assert by_row["resnet18-mini"] == [0, 1, 3] and by_row["quadratic-mini"] == [1, 2]
    assert by_row["learned-content-mini"] == [1]
    assert list(by_row) == ["quadratic-mini", "learned-mini", "resnet18-mini", "quadratic-generalized-mini",
                            "learned-content-mini"]


def test_a_smoke_runs_length_is_checked_against_the_folder_in_a_suite_that_sets_none(tmp_path):
    folder = tmp_path / "resnet18-mini" / "seed0"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"preset": "resnet18-mini", "seed": 0, "epochs": 1}))
    (folder / "finished.json").write_text("{}")
    (job,) = plan(get_suite("mini"), tmp_path, only=("resnet18-mini",), seeds=(0,), epochs=1)
    assert job_state(job) == "finished"
    (job,) = plan(get_suite("mini"), tmp_path, only=("resnet18-mini",), seeds=(0,), epochs=50)
    with pytest.raises(ValueError, match="epochs=50"):          # not "finished already", not resumed to 50
        job_state(job)
