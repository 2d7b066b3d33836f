"""The trained models that come with the package, and the download manifest, are what
benchmarks/package_models.py makes from results/: never edited by hand, never stale."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from package_models import (DOWNLOAD_FILES, DOWNLOADS, MANIFEST, PACKAGE, PACKAGED, PACKAGED_SUITE, RESULTS,
                            differences, run_folder)

from attncnn.api import PACKAGED_MODELS, list_pretrained
from attncnn.runs.checkpoint import load_checkpoint, read_metadata

pytestmark = pytest.mark.skipif(not (RESULTS / PACKAGED_SUITE).is_dir(), reason="no committed results/mini-long")
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def test_regenerating_from_results_changes_no_packaged_file():
    assert PACKAGE == PACKAGED_MODELS
    assert differences(RESULTS, PACKAGE) == []


@pytest.mark.parametrize("name", sorted(PACKAGED))
def test_the_packaged_weights_are_the_final_weights_rounded(name):
    run, packaged = run_folder(RESULTS, PACKAGED_SUITE, name), run_folder(PACKAGE, PACKAGED_SUITE, name)
    final = load_checkpoint(run / "checkpoints" / "last.safetensors")
    shipped = load_checkpoint(packaged / "checkpoints" / "last.safetensors")
    dtype = _DTYPES[PACKAGED[name]]
    assert shipped.model_state.keys() == final.model_state.keys() and shipped.optimizer_state is None
    assert shipped.extra_tensors == {}                                  # no random-number states
    for key, weights in final.model_state.items():
        want = weights.to(dtype) if weights.is_floating_point() else weights
        assert shipped.model_state[key].dtype == want.dtype and torch.equal(shipped.model_state[key], want), key
    assert shipped.metadata == final.metadata == read_metadata(run / "checkpoints" / "last.safetensors")
    recorded = json.loads((run / "finished.json").read_text())
    summary = json.loads((packaged / "finished.json").read_text())
    assert summary["final"]["test_accuracy"] == recorded["final"]["test_accuracy"] and summary["epochs"] == 60
    assert summary["packaged"] == {**summary["packaged"], "weights_dtype": PACKAGED[name],
                                   "from": f"results/{PACKAGED_SUITE}/{name}/seed0"}
    assert sorted(p.relative_to(packaged).as_posix() for p in packaged.rglob("*") if p.is_file()) == [
        "checkpoints/last.safetensors", "config.json", "finished.json", "machine.json"]
    assert (packaged / "config.json").read_bytes() == (run / "config.json").read_bytes()


def test_the_manifest_matches_the_files_in_results():
    models = json.loads((PACKAGE / MANIFEST).read_text())["models"]
    assert sorted(models) == sorted(DOWNLOADS)
    for name, entry in models.items():
        run = RESULTS / entry["path"]
        assert entry["path"] == f"paper-long/{name}/seed0" and sorted(entry["files"]) == sorted(DOWNLOAD_FILES)
        for rel, spec in entry["files"].items():
            data = (run / rel).read_bytes()
            assert spec == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, (name, rel)


def test_the_packaged_models_are_the_five_sixty_epoch_mini_models_of_mini_long(tmp_path):
    assert sorted(PACKAGED) == ["learned-content-mini", "learned-mini", "quadratic-generalized-mini",
                                "quadratic-mini", "resnet18-mini"]
    # from the package alone (an empty results folder given as root is the only other place)
    assert sorted(name for name, seed in list_pretrained(PACKAGE)) == sorted(PACKAGED)
    assert all(seed == 0 for _, seed in list_pretrained(PACKAGE))
