"""docs/ and README.md name only paths that exist, and cite nothing outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A repository path in backquotes: `dynamoctl/plan/build.py`, `tests/infra/`, ...
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


# Merge-conflict markers at a line's start (written split so this file holds none).
OURS, BASE, THEIRS = "<" * 7 + " ", "=" * 7, ">" * 7 + " "


def conflict_markers(text: str) -> list[int]:
    """Line numbers of conflict markers: ``<<<<<<< `` and ``>>>>>>> `` anywhere, and a
    lone ``=======`` between them (elsewhere it can be a heading's underline)."""
    found, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith(OURS) or line.startswith(THEIRS):
            found.append(number)
            inside = line.startswith(OURS)
        elif inside and line == BASE:
            found.append(number)
    return found


def test_no_tracked_text_file_holds_a_conflict_marker() -> None:
    names = (
        subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    marked = {}
    for name in filter(None, names):
        path = REPO / name
        if not path.is_file():  # a submodule, or deleted in the work tree
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary
            continue
        if lines := conflict_markers(data.decode("utf-8", errors="replace")):
            marked[name] = lines
    assert marked == {}


def test_conflict_markers_are_found() -> None:
    text = f"a\n{OURS}HEAD\nb\n{BASE}\nc\n{THEIRS}b3\n{BASE}\n"
    assert conflict_markers(text) == [2, 4, 6]


def section(text: str, heading: str) -> str:
    """The body of a Markdown section, up to the next heading of its level or above."""
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(rf"\n#{{1,{heading.index(' ')}}} ", body, maxsplit=1)[0]


def tracked(*patterns: str) -> list[str]:
    """Tracked files matching git pathspecs (a local venv under benchmarks/ is not)."""
    out = subprocess.run(
        ["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_the_readme_lists_every_doc() -> None:
    listed = section((REPO / "README.md").read_text(encoding="utf-8"), "## Documentation")
    assert [doc for doc in tracked("docs/*.md") if f"`{doc}`" not in listed] == []


def test_the_benchmarks_readme_names_every_script() -> None:
    readme = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    scripts = [
        name.removeprefix("benchmarks/") for name in tracked("benchmarks/*.py", "benchmarks/*.sh")
    ]
    assert scripts and [name for name in scripts if f"`{name}`" not in readme] == []
