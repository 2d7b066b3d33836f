"""One default query token: the grid's centre, in ``attncnn plot``'s figures and on the viewer page
(which began at row 4, column 5 while plot took the centre)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from attncnn.analysis.runs import default_query

REPO = Path(__file__).resolve().parents[2]
CENTRE_JS = "state.query = [Math.floor(H / 2), Math.floor(W / 2)];"


def test_the_default_query_is_the_grid_centre():
    assert default_query(16, 16) == (8, 8) and default_query(5, 8) == (2, 4) and default_query(1, 1) == (0, 0)


def test_the_viewer_page_starts_at_the_same_query_as_plot():
    # page.js computes default_query's rule for the grid of the run it shows (the browser tests check
    # the page in Chromium); the committed pages inline the same script
    script = files("attncnn.analysis.viewer").joinpath("page.js").read_text()
    assert script.count("state.query = [") == 2 and CENTRE_JS in script      # the default, and a click
    for page in sorted((REPO / "results").glob("*/viewer.html")):
        text = page.read_text(encoding="utf-8")
        assert CENTRE_JS in text and "Math.min(4, H - 1)" not in text, page
