"""The viewer page in real headless Chromium, driven by Playwright.

The page must decode its embedded data with the browser's own DecompressionStream, react to
clicks on the image and to its controls, and show exactly the values that
:func:`viewer_oracle.page_maps` (the page's rules in numpy, checked against the model's maps in
test_viewer.py) gives. Screenshots go to $ATTNCNN_TEST_ARTIFACTS (CI) or the test's
tmp_path. Without Chromium or Playwright these tests skip, except under CI (or with
$ATTNCNN_REQUIRE_BROWSER set, as .ci/run does), where they fail.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from attncnn.analysis.maps import attention_maps
from attncnn.analysis.metrics import quadratic_head_parameters
from attncnn.analysis.runs import default_query, open_run
from attncnn.analysis.runs import test_images as load_test_images
from attncnn.analysis.viewer import read_viewer, write_viewer
from viewer_oracle import page_maps

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("ATTNCNN_CHROMIUM", "/usr/bin/chromium")
# No network here: without these switches Chromium keeps trying to reach its services.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _unavailable(reason: str):
    if os.environ.get("CI") or os.environ.get("ATTNCNN_REQUIRE_BROWSER"):
        pytest.fail(f"{reason} (CI must have it: .ci/run installs the chromium package and the test extra)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        _unavailable(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        # launch() starts a fresh temporary profile; new_page() a non-persistent context
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def artifacts(tmp_path) -> Path:
    folder = os.environ.get("ATTNCNN_TEST_ARTIFACTS")
    if not folder:
        return tmp_path
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def page_file(runs, tmp_path_factory) -> Path:
    """Content run first, quadratic run second; test images 0 and 5, average of 4."""
    out = tmp_path_factory.mktemp("viewer-browser") / "viewer.html"
    return write_viewer([runs["content"], runs["quadratic"]], out, indices=[0, 5], average=4)


class Viewer:
    """A loaded page plus helpers that wait for the page's next render."""

    def __init__(self, browser, path: Path):
        self.page = browser.new_page(viewport={"width": 1300, "height": 1000})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("pageerror", lambda err: self.errors.append(str(err)))
        self.page.on("console", lambda msg: self.errors.append(msg.text) if msg.type == "error" else None)
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.goto(path.as_uri())
        self.page.wait_for_function("document.body.dataset.state === 'ready'", timeout=20_000)

    def renders(self) -> int:
        return int(self.page.evaluate("document.body.dataset.renders"))

    def after(self, action) -> None:
        """Run ``action`` (a user action) and wait until the page has rendered its result."""
        before = self.renders()
        action()
        self.page.wait_for_function(
            f"+document.body.dataset.renders > {before} && document.body.dataset.state === 'ready'", timeout=20_000)

    def state(self) -> dict:
        return self.page.evaluate("({...attncnnViewer.state})")

    def shown(self) -> list[list[np.ndarray]]:
        """Every (layer, head) map the page shows for its query, as numbers."""
        return [[np.array(v) for v in layer] for layer in self.page.evaluate(
            "attncnnViewer.manifest.runs[attncnnViewer.state.run].heads.map("
            "(n, l) => Array.from({length: n}, (_, h) => attncnnViewer.values(l, h)))")]

    def click_token(self, row: int, col: int, grid: tuple[int, int]) -> None:
        box = self.page.locator("#image-canvas").bounding_box()
        h, w = grid
        self.after(lambda: self.page.mouse.click(box["x"] + (col + 0.5) * box["width"] / w,
                                                 box["y"] + (row + 0.5) * box["height"] / h))


def _matches(shown, expected, query: int) -> None:
    """The page's values equal page_maps' row for ``query`` (float64 both sides: same arithmetic)."""
    assert len(shown) == len(expected)
    for layer_shown, layer_expected in zip(shown, expected):
        assert len(layer_shown) == layer_expected.shape[0]
        for head_shown, head_expected in zip(layer_shown, layer_expected):
            np.testing.assert_allclose(head_shown, head_expected[query], rtol=1e-9, atol=1e-12)


def test_content_run_query_kinds_softmax_and_images(browser, page_file, runs, artifacts):
    data = read_viewer(page_file)
    grid = tuple(data.manifest["runs"][0]["grid"])
    w = grid[1]
    viewer = Viewer(browser, page_file)
    page = viewer.page
    center = default_query(*grid)                         # as `attncnn plot` takes it
    assert viewer.state()["query"] == list(center) and viewer.state()["image"] == "0"
    _matches(viewer.shown(), page_maps(data, 0, "0", "all", True), center[0] * w + center[1])
    before = viewer.shown()

    # a click on the image picks the query token under the pointer
    viewer.click_token(2, 6, grid)
    assert viewer.state()["query"] == [2, 6]
    after = viewer.shown()
    assert any(not np.allclose(a, b) for la, lb in zip(after, before) for a, b in zip(la, lb))
    _matches(after, page_maps(data, 0, "0", "all", True), 2 * w + 6)
    # ... and those probabilities are the model's (hooked real activations), to the quantisation error
    images, _ = load_test_images(open_run(runs["content"]), [0])
    truth = attention_maps(open_run(runs["content"]).model, images, kind="probs")
    for layer, maps in zip(after, truth):
        for h, head in enumerate(layer):
            np.testing.assert_allclose(head, maps.probs[0, h, 2 * w + 6].double().numpy(), rtol=0.05, atol=2e-3)

    # value kinds and the softmax switch
    viewer.after(lambda: page.select_option("#kind-select", "content"))
    _matches(viewer.shown(), page_maps(data, 0, "0", "content", True), 2 * w + 6)
    viewer.after(lambda: page.uncheck("#softmax"))
    _matches(viewer.shown(), page_maps(data, 0, "0", "content", False), 2 * w + 6)
    viewer.after(lambda: page.select_option("#kind-select", "positional"))
    _matches(viewer.shown(), page_maps(data, 0, "0", "positional", False), 2 * w + 6)
    viewer.after(lambda: page.select_option("#kind-select", "all"))
    _matches(viewer.shown(), page_maps(data, 0, "0", "all", False), 2 * w + 6)
    viewer.after(lambda: page.check("#softmax"))

    # another image, then the batch average (stored averaged probabilities)
    viewer.after(lambda: page.click('#thumbs .thumb[data-key="5"]'))
    _matches(viewer.shown(), page_maps(data, 0, "5", "all", True), 2 * w + 6)
    viewer.after(lambda: page.click('#thumbs .thumb[data-key="average"]'))
    assert viewer.state()["image"] == "average"
    _matches(viewer.shown(), page_maps(data, 0, "average", "all", True), 2 * w + 6)
    viewer.after(lambda: page.select_option("#scale-select", "layer"))
    assert page.locator("#view-select option[value=centers]").is_disabled()    # no centres: not quadratic

    info = page.locator("#run-info").inner_text()
    assert "content" in info and "test accuracy" in info and "%" in info
    page.screenshot(path=str(artifacts / "viewer-content-maps.png"), full_page=True)
    assert not viewer.errors
    assert all(url.startswith(("file:", "data:", "blob:")) for url in viewer.requests), viewer.requests


def test_quadratic_run_maps_and_centres_view(browser, page_file, runs, artifacts):
    data = read_viewer(page_file)
    grid = tuple(data.manifest["runs"][1]["grid"])
    w = grid[1]
    viewer = Viewer(browser, page_file)
    page = viewer.page
    viewer.after(lambda: page.select_option("#run-select", "1"))
    assert viewer.state()["run"] == 1
    assert page.locator("#kind-select option[value=content]").is_disabled()
    assert not page.locator("#kind-select option[value=positional]").is_disabled()
    row, col = default_query(*grid)                       # another run: its own grid's centre
    _matches(viewer.shown(), page_maps(data, 1, "0", "all", True), row * w + col)

    # keyboard: the arrow keys move the query
    page.locator("#image-canvas").focus()
    viewer.after(lambda: page.keyboard.press("ArrowLeft"))
    assert viewer.state()["query"] == [row, col - 1]
    _matches(viewer.shown(), page_maps(data, 1, "0", "all", True), row * w + col - 1)
    viewer.after(lambda: page.uncheck("#softmax"))
    _matches(viewer.shown(), page_maps(data, 1, "0", "all", False), row * w + col - 1)

    viewer.after(lambda: page.select_option("#view-select", "centers"))
    assert page.locator("#centers-view").is_visible() and not page.locator("#maps-view").is_visible()
    markers = page.evaluate("attncnnViewer.centers()")
    model = open_run(runs["quadratic"]).model
    expected = [(layer, h, *quadratic_head_parameters(block.attention)["center"][h].tolist())
                for layer, block in enumerate(model.blocks) for h in range(block.attention.num_heads)]
    assert len(markers) == len(expected)
    for marker, (layer, h, row, col) in zip(markers, expected):
        assert (marker["layer"], marker["head"]) == (layer, h)
        assert marker["row"] == pytest.approx(row) and marker["col"] == pytest.approx(col)
        # drawn relative to the query cell in the panel's middle
        cell, radius = marker["cell"], marker["radius"]
        assert marker["x"] == pytest.approx((radius + col + 0.5) * cell)
        assert marker["y"] == pytest.approx((radius + row + 0.5) * cell)
    assert page.locator("#centers canvas").count() == len(model.blocks)
    page.screenshot(path=str(artifacts / "viewer-quadratic-centres.png"), full_page=True)

    # back to a run without centres: the view falls back to the maps
    viewer.after(lambda: page.select_option("#run-select", "0"))
    assert viewer.state()["view"] == "maps" and page.locator("#maps-view").is_visible()
    assert not viewer.errors


def test_gpsa_gates_under_the_maps(browser, tmp_path):
    import math

    from attncnn.analysis.viewer import build_html
    from test_viewer_gates import LAMBDAS, gpsa_export

    path = tmp_path / "gpsa.html"
    path.write_text(build_html([gpsa_export("gpsa-mini", head_dim=8)]), encoding="utf-8")
    viewer = Viewer(browser, path)
    shown = viewer.page.locator("#maps-table .gate").all_inner_texts()
    expected = [1 / (1 + math.exp(-1.0))] * 9 + [1 / (1 + math.exp(-v)) for v in LAMBDAS]
    assert shown == [f"gate {g:.2f}" for g in expected]
    title = viewer.page.locator('#maps-table canvas.map[data-layer="1"][data-head="0"]').get_attribute("title")
    assert title.startswith(f"layer 2, head 1, gate {expected[9]:.3f}:")
    assert not viewer.errors


def test_rollout_is_one_map_per_layer_and_the_softmax_switch_does_not_apply(browser, page_file, artifacts):
    data = read_viewer(page_file)
    info = data.manifest["runs"][0]
    w, layers = info["grid"][1], info["layers"]
    row, col = default_query(*info["grid"])               # the page starts on the grid's centre
    query = row * w + col
    viewer = Viewer(browser, page_file)
    page = viewer.page
    rollout_values = f"Array.from({{length: {layers}}}, (_, l) => [attncnnViewer.values(l, 0)])"
    viewer.after(lambda: page.select_option("#kind-select", "rollout"))
    assert page.locator("#maps-table canvas.map").count() == layers and page.locator("#softmax").is_disabled()
    shown = [[np.array(v) for v in layer] for layer in page.evaluate(rollout_values)]
    _matches(shown, page_maps(data, 0, "0", "rollout"), query)
    assert all(abs(layer[0].sum() - 1) < 0.02 for layer in shown)      # rows of a rollout sum to 1
    viewer.after(lambda: page.click('#thumbs .thumb[data-key="average"]'))
    shown = [[np.array(v) for v in layer] for layer in page.evaluate(rollout_values)]
    _matches(shown, page_maps(data, 0, "average", "rollout"), query)
    page.screenshot(path=str(artifacts / "viewer-rollout.png"), full_page=True)
    # back to the heads: one map per head again, the softmax switch live
    viewer.after(lambda: page.select_option("#kind-select", "all"))
    assert page.locator("#maps-table canvas.map").count() == sum(info["heads"])
    assert not page.locator("#softmax").is_disabled()
    _matches(viewer.shown(), page_maps(data, 0, "average", "all", True), query)
    assert not viewer.errors
