"""``python -m build`` gives an sdist and a wheel built from that sdist; the wheel installs into a fresh
virtual environment, where the command line runs, the viewer page is written with its assets
(page.html, .css, .js), the packaged mini models classify CIFAR-10 as in the clone, and ``attncnn
download`` fetches a width-400 model into the user cache where ``attncnn.pretrained`` finds it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VIEWER_ASSETS = ("page.html", "page.css", "page.js", "decode.js")
PACKAGED = REPO / "src" / "attncnn" / "pretrained_models"
#: what a wheel may weigh with its packaged models
MAX_WHEEL_BYTES = 15_000_000
pytestmark = pytest.mark.slow


def _run(*command, cwd: Path | None = None, timeout: int = 600, env: dict | None = None) -> str:
    """Run ``command``; without ``env``, in this environment less PYTHONPATH (which would put a
    checkout's src/ before the installed package)."""
    env = env if env is not None else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The wheel and sdist of a copy of the sources (building writes egg-info beside them, so not here)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("dist")
    # no isolation: the build backend (setuptools, from the test extra) is already here, no download
    _run(sys.executable, "-m", "build", "--no-isolation", "--sdist", "--outdir", out, source)
    # the wheel from the sdist (what a plain `python -m build` does too): the wheel installed below is
    # what pip would build from the sdist, so the sdist needs no install of its own
    sdist, = out.glob("attncnn-*.tar.gz")
    _run(sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", out, sdist)
    return out


def _fresh_venv(root: Path) -> Path:
    """A new virtual environment that sees this one's packages (torch & co.) but not its attncnn: a .pth
    file adds this environment's site-packages as a plain folder, whose own .pth files (the editable
    install's) are not processed. Returns its Python."""
    _run(sys.executable, "-m", "venv", "--without-pip", root)
    python = root / "bin" / "python"
    target = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (target / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _install(python: Path, artifact: Path) -> None:
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", artifact)


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed (the tests below only run it); its root."""
    root = tmp_path_factory.mktemp("installed") / "venv"
    wheel, = dist.glob("attncnn-*.whl")
    _install(_fresh_venv(root), wheel)
    return root


def test_the_wheel_and_sdist_hold_the_package_the_viewer_assets_and_the_mini_models_not_the_results(dist):
    wheel, = dist.glob("attncnn-*.whl")
    sdist, = dist.glob("attncnn-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"attncnn/analysis/viewer/{asset}" for asset in VIEWER_ASSETS} <= set(names)
    assert "attncnn/api/pretrained.py" in names
    packaged = sorted(p.relative_to(PACKAGED.parent.parent).as_posix() for p in PACKAGED.rglob("*")
                      if p.suffix in (".json", ".safetensors"))
    assert len(packaged) == 1 + 5 * 4                   # the manifest; 5 models x config, finished, machine, weights
    assert sorted(n for n in names if n.startswith("attncnn/pretrained_models/")) == packaged
    assert [n for n in names if n.endswith(".safetensors")] == [n for n in packaged if n.endswith(".safetensors")]
    assert not [n for n in names if "results/" in n]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert wheel.stat().st_size < MAX_WHEEL_BYTES, f"{wheel.stat().st_size:,} bytes"
    listing = _run("tar", "-tzf", sdist).splitlines()
    assert all(any(n.endswith(f"src/attncnn/analysis/viewer/{asset}") for n in listing) for asset in VIEWER_ASSETS)
    assert sorted(n.split("/", 1)[1] for n in listing if n.endswith(".safetensors")) == [
        f"src/{n}" for n in packaged if n.endswith(".safetensors")]
    assert any(n.endswith("/LICENSE") for n in listing) and not [n for n in listing if "/results/" in n]


def test_it_installs_into_a_fresh_environment_and_runs(installed, tmp_path, make_tiny_data):
    python = installed / "bin" / "python"
    where = _run(python, "-c", "import attncnn; print(attncnn.__file__)").strip()
    assert Path(where).is_relative_to(installed), where                 # the installed copy, not src/
    attncnn = installed / "bin" / "attncnn"
    presets = _run(attncnn, "presets")
    assert "quadratic " in presets and "12,086,844" in presets
    # outside a clone: the width-400 models are not in the package, and the error says the three ways
    done = subprocess.run([str(python), "-c", "import attncnn; attncnn.pretrained('quadratic')"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=_outside_a_clone(tmp_path))
    assert done.returncode == 1, done.stderr
    assert ("A trained model comes one of three ways: with the installed package (the 60-epoch mini models: "
            "learned-content-mini, learned-mini, quadratic-generalized-mini, quadratic-mini, resnet18-mini)"
            ) in done.stderr
    assert "`attncnn download quadratic --from URL_OR_FOLDER`" in done.stderr
    run, page = tmp_path / "run", tmp_path / "viewer.html"
    _run(attncnn, "train", "--preset", "demo", "--data", make_tiny_data(10, 4), "--epochs", "1", "--batch-size", "10",
         "--set", "dim=16", "--set", "mlp_dim=16", "--out", run, "--no-progress")
    _run(attncnn, "viewer", run, "--images", "0", "--average", "0", "--out", page)
    html = page.read_text()
    assets = REPO / "src" / "attncnn" / "analysis" / "viewer"
    longest = {name: max((assets / name).read_text().splitlines(), key=len).strip() for name in VIEWER_ASSETS[1:]}
    assert len(html) > 10_000 and all(line in html for line in longest.values())   # css and scripts inlined


def _outside_a_clone(tmp_path: Path) -> dict:
    """The environment of a user without a clone: no results folder named, an empty user cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNCNN_RESULTS", "PYTHONPATH")}
    return {**env, "ATTNCNN_CACHE_DIR": str(tmp_path / "user-cache")}


_CLASSIFY = """
import json, sys, torch, attncnn
from attncnn.data import class_balanced_subset, load_dataset
model = attncnn.pretrained("quadratic-mini")
test = load_dataset(sys.argv[1]).test
sample = class_balanced_subset(test.labels, 500, seed=0)
with torch.no_grad():
    predicted = model.logits(test.images[sample]).argmax(1)
print(json.dumps({"source": str(model.source), "predicted": predicted.tolist()}))
"""


def _classify(model, images):
    import torch

    with torch.no_grad():
        return model.logits(images).argmax(1)


def test_an_installed_wheel_has_the_mini_models_and_fetches_a_large_one(installed, tmp_path, cifar10_path):
    import attncnn
    from attncnn.data import class_balanced_subset, load_dataset

    python = installed / "bin" / "python"
    env = _outside_a_clone(tmp_path)
    found = json.loads(_run(python, "-c", _CLASSIFY, cifar10_path, cwd=tmp_path, env=env))
    assert Path(found["source"]).is_relative_to(installed)           # the package's own copy
    # the same predictions as the clone's packaged files, and as good as the run's float32 weights
    test = load_dataset(str(cifar10_path)).test
    sample = class_balanced_subset(test.labels, 500, seed=0)
    images, labels = test.images[sample], test.labels[sample]
    packaged = _classify(attncnn.load_model(PACKAGED / "mini-long" / "quadratic-mini" / "seed0"), images)
    assert found["predicted"] == packaged.tolist()
    full = _classify(attncnn.load_model(REPO / "results" / "mini-long" / "quadratic-mini" / "seed0"), images)
    assert int((packaged == labels).sum()) >= int((full == labels).sum()) - 2             # within 0.4 points
    assert int((packaged != full).sum()) <= 5
    # a width-400 model on request, from a copy of results/, into the user cache where pretrained finds it
    attncnn_command = installed / "bin" / "attncnn"
    printed = _run(attncnn_command, "download", "resnet18", "--from", REPO / "results", cwd=tmp_path, env=env)
    cached = tmp_path / "user-cache" / "models" / "paper-long" / "resnet18" / "seed0"
    assert f"resnet18: {cached}" in printed
    source = _run(python, "-c", "import attncnn; print(attncnn.pretrained('resnet18').source)", cwd=tmp_path, env=env)
    assert Path(source.strip()) == cached / "checkpoints" / "last.safetensors"
