"""notebooks/tour.ipynb: stored without outputs, and it runs top to bottom (CI executes it)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOUR = REPO / "notebooks" / "tour.ipynb"


def _cifar10_copy() -> Path | None:
    """The CIFAR-10 copy the other tests use ($ATTNCNN_TEST_CIFAR10, else the shared one beside the repository)."""
    env = os.environ.get("ATTNCNN_TEST_CIFAR10")
    path = Path(env) if env else REPO.parent / "shared" / "data" / "cifar10-jpeg.zip"
    return path if path.exists() else None


def test_the_tour_is_stored_without_outputs():
    notebook = json.loads(TOUR.read_text())
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert len(code) >= 6
    dirty = [i for i, cell in enumerate(code) if cell.get("outputs") or cell.get("execution_count") is not None]
    assert not dirty, f"code cells {dirty} keep outputs: clear them before committing (Jupyter: Clear All Outputs)"
    assert set(notebook["metadata"]) <= {"kernelspec", "language_info"}       # no widget state, no user paths


def _import_or_skip(name: str):
    if os.environ.get("CI"):
        return __import__(name)            # the notebook extra is installed in CI: it must run there
    return pytest.importorskip(name)


@pytest.mark.slow
@pytest.mark.parametrize("with_data", [True, False], ids=["cifar10", "no-data"])
def test_the_tour_runs_top_to_bottom(with_data, tmp_path, monkeypatch):
    nbformat = _import_or_skip("nbformat")
    nbclient = _import_or_skip("nbclient")
    _import_or_skip("ipykernel")
    data = _cifar10_copy() if with_data else None
    if with_data and data is None:
        pytest.skip("no CIFAR-10 copy: set ATTNCNN_TEST_CIFAR10")
    # without data the tour draws its own images and skips the viewer page, and still runs
    monkeypatch.setenv("ATTNCNN_TEST_CIFAR10", str(data) if data else str(tmp_path / "no-such-copy.zip"))
    monkeypatch.setenv("ATTNCNN_TOUR_OUT", str(tmp_path / "out"))
    notebook = nbformat.read(TOUR, as_version=4)
    start = time.perf_counter()
    # run in a temporary folder: whatever the notebook writes stays out of the repository
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    seconds = time.perf_counter() - start
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    images = [out for out in outputs if "image/png" in out.get("data", {})]
    assert len(images) >= 4                # the classified images, Fig. 4, Fig. 5, conv vs attention
    text = "".join(out.get("text", "") for out in outputs)
    assert "max |conv - attention| = " in text and "layers, probabilities (1, 9, 256, 256)" in text
    if data is not None:
        assert (tmp_path / "out" / "tour-viewer.html").stat().st_size > 10_000
    else:
        assert "none found, images are drawn below instead" in text and not (tmp_path / "out").exists()
    assert seconds < 180, f"the tour took {seconds:.0f} s; keep it under 3 minutes for CI"
    assert not list(TOUR.parent.glob("tour-output*"))
