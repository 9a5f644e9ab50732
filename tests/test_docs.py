"""docs/ and README.md name only paths that exist, and cite nothing outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A repository path in backquotes: `dynamoctl/supervisor/plan.py`, `tests/infra/`, ...
PATH = re.compile(r"`((?:dynamoctl|tests|benchmarks|deploy|scripts|recipes|slurm|docs)/[\w./-]*)`")


def test_every_path_the_docs_name_exists() -> None:
    missing = [
        f"{doc.relative_to(REPO)}: {path}"
        for doc in DOCS
        for path in PATH.findall(doc.read_text(encoding="utf-8"))
        if not (REPO / path).exists()
    ]
    assert missing == []


def test_nothing_cites_files_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "grep", "-n", "-E", r"DESIGN ?§|DESIGN\.md|\.\./shared/|shared/(DESIGN|REFERENCE)"],
        cwd=REPO, capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    assert [
        line for line in tracked.splitlines() if not line.startswith("tests/test_docs.py")
    ] == []
