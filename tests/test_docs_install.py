"""What a new user copies from the README and the quick start: one torch line, the same CI runs, with
the CPU build beside it; every dependency named; commands that leave the clone as it was."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = (REPO / "README.md", REPO / "docs" / "quickstart.md")
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def _torch_installs(text: str) -> tuple[list[str], list[str]]:
    """(commands, commented alternatives) that install torch, as written."""
    commands, comments = [], []
    for line in text.splitlines():
        code, _, comment = line.partition("#")
        if re.search(r"pip install .*\btorch==", code):
            commands.append(" ".join(code.split()))
        if re.search(r"pip install .*\btorch==", comment):
            comments.append(" ".join(comment.split()))
    return commands, comments


def test_one_torch_install_line_everywhere_with_the_cpu_build_beside_it():
    ci_commands, ci_comments = _torch_installs((REPO / ".ci" / "run").read_text())
    assert ci_commands == ["python -m pip install --quiet torch==2.13.0"]
    pinned = ci_commands[0].split()[-1]
    for page in PAGES:
        commands, comments = _torch_installs(page.read_text())
        assert commands == [f"pip install {pinned}"], page.name            # README's had an index URL
        assert any(CPU_INDEX in c and pinned in c for c in comments), page.name
    assert any(CPU_INDEX in c and pinned in c for c in ci_comments)


def test_the_dependency_lists_name_every_dependency_of_the_package():
    # the [project] dependencies array (read with a pattern: tomllib is Python 3.11+, the package 3.10+)
    block = re.search(r"^dependencies = \[(.*?)^\]", (REPO / "pyproject.toml").read_text(), re.S | re.M).group(1)
    declared = re.findall(r'"([^"]+)"', block)
    names = [re.split(r"[<>=!~ ;\[]", d)[0] for d in declared]
    assert "PyYAML" in names
    for page in PAGES:
        listed = re.search(r"Dependencies: (.*?)(?:\(no torchvision|; no\s+torchvision)", page.read_text(), re.S)
        assert listed, page.name
        missing = [n for n in names if n.lower() not in listed.group(1).lower()]
        assert missing == [], page.name


def test_the_quick_starts_commands_leave_no_untracked_folder_in_the_clone():
    ignored = {line.strip().strip("/") for line in (REPO / ".gitignore").read_text().splitlines()
               if line.startswith("/") and line.rstrip().endswith("/")}
    for line in (REPO / "docs" / "quickstart.md").read_text().splitlines():
        code = line.partition("#")[0].strip()
        if not code.startswith("attncnn ") or "--out" not in code:
            continue
        words = shlex.split(code)
        out = words[words.index("--out") + 1]
        assert out.startswith(("~", "/")) or Path(out).parts[0] in ignored, code
    assert "figures" in ignored and "runs" in ignored            # `attncnn plot`'s and `train`'s defaults


def test_the_quick_start_says_where_progress_shows():
    text = " ".join((REPO / "docs" / "quickstart.md").read_text().split())
    assert "a progress bar per epoch is not shown" not in text
    assert "without one (a log file, CI) an epoch of 30 s or more logs a line about every tenth of it" in text
