"""The field guide ships with the project: a clone has docs/GUIDE.md, and nothing points outside it."""

from __future__ import annotations

import re

from tests.conftest import REPO

SOURCES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "moe_vlm").rglob("*.py")),
    *sorted((REPO / "hydra_plugins").rglob("*.py")),
    *sorted((REPO / "scripts").glob("*")),
]


def test_the_field_guide_is_in_docs() -> None:
    guide = REPO / "docs" / "GUIDE.md"
    assert guide.is_file() and guide.read_text().startswith("# Field guide")


def test_every_mention_of_the_guide_names_the_copy_in_docs() -> None:
    wrong = []
    for path in (p for p in SOURCES if p.is_file()):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            for mention in re.findall(r"[\w./-]*GUIDE\.md", line):
                # From the repository root docs/GUIDE.md; from docs/ itself, GUIDE.md.
                allowed = {"docs/GUIDE.md"} | ({"GUIDE.md"} if path.parent.name == "docs" else set())
                if mention not in allowed:
                    wrong.append(f"{path.relative_to(REPO)}:{number}: {mention}")
    assert wrong == [], wrong


def test_the_readme_links_the_guide() -> None:
    assert "](docs/GUIDE.md)" in (REPO / "README.md").read_text()
