"""``python -m build`` gives a wheel and an sdist that install into fresh virtual environments, where
the command line runs and the viewer page is written with its assets (page.html, .css, .js)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VIEWER_ASSETS = ("page.html", "page.css", "page.js", "decode.js")
pytestmark = pytest.mark.slow


def _run(*command, cwd: Path | None = None, timeout: int = 600) -> str:
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The wheel and sdist of a copy of the sources (building writes egg-info beside them, so not here)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("dist")
    # no isolation: the build backend (setuptools, from the test extra) is already here, no download
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source)
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


def test_the_wheel_and_sdist_hold_the_package_and_the_viewer_assets_not_the_results(dist):
    wheel, = dist.glob("attncnn-*.whl")
    sdist, = dist.glob("attncnn-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"attncnn/analysis/viewer/{asset}" for asset in VIEWER_ASSETS} <= set(names)
    assert "attncnn/api/pretrained.py" in names
    assert not [n for n in names if "results/" in n or n.endswith(".safetensors")]
    listing = _run("tar", "-tzf", sdist)
    assert all(f"src/attncnn/analysis/viewer/{asset}" in listing for asset in VIEWER_ASSETS)
    assert ".safetensors" not in listing


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_it_installs_into_a_fresh_environment_and_runs(kind, dist, tmp_path, make_tiny_data):
    artifact, = dist.glob("attncnn-*.whl" if kind == "wheel" else "attncnn-*.tar.gz")
    python = _fresh_venv(tmp_path / "venv")
    _install(python, artifact)
    where = _run(python, "-c", "import attncnn; print(attncnn.__file__)").strip()
    assert Path(where).is_relative_to(tmp_path / "venv"), where                 # the installed copy, not src/
    attncnn = tmp_path / "venv" / "bin" / "attncnn"
    presets = _run(attncnn, "presets")
    assert "quadratic " in presets and "12,086,844" in presets
    # the shipped models are not in the package: the error says where it looked and what to do
    done = subprocess.run([str(python), "-c", "import attncnn; attncnn.pretrained('learned-mini')"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "clone the repository and pass root=" in done.stderr
    if kind == "sdist":
        return                                         # the same package: the wheel's run below covers the rest
    run, page = tmp_path / "run", tmp_path / "viewer.html"
    _run(attncnn, "train", "--preset", "demo", "--data", make_tiny_data(10, 4), "--epochs", "1", "--batch-size", "10",
         "--set", "dim=16", "--set", "mlp_dim=16", "--out", run, "--no-progress")
    _run(attncnn, "viewer", run, "--images", "0", "--average", "0", "--out", page)
    html = page.read_text()
    assets = REPO / "src" / "attncnn" / "analysis" / "viewer"
    longest = {name: max((assets / name).read_text().splitlines(), key=len).strip() for name in VIEWER_ASSETS[1:]}
    assert len(html) > 10_000 and all(line in html for line in longest.values())   # css and scripts inlined
