"""The README stays a front page and its links lead somewhere; every page the site lists exists.
(`mkdocs build --strict` in .ci/run checks the site's own links and the API reference.)"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_a_front_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "python3 -m venv" in text and "python -m pytest" in text and "attncnn.pretrained(" in text
    assert text.count("![") == 1                                  # one figure


def test_every_relative_link_of_the_readme_and_the_docs_exists():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    missing = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            base = REPO if page.parent == REPO or target.startswith("results/") else page.parent
            if not (base / target).exists():
                missing.append(f"{page.relative_to(REPO)} -> {target}")
    assert not missing


def test_the_site_lists_only_pages_that_exist():
    config = (REPO / "mkdocs.yml").read_text()
    listed = re.findall(r":\s+([\w/.-]+\.md)\s*$", config, flags=re.M)
    assert len(listed) >= 20 and "speed.md" in listed and "python-api.md" in listed
    assert [p for p in listed if not (REPO / "docs" / p).is_file()] == []
