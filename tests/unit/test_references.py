"""Comments, docstrings and documents point only at what the repository holds. A section of the
product specification or a tracker issue by its number is something a reader of the checkout cannot
open: name the document and section here that states the rule (docs/architecture.md,
docs/operations.md, docs/protocol.md, docs/reliability.md, the README, …), or state the rule."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("app", "handlers", "storage", "migrations", "docs", "tests", "bench", ".ci")
FILES = ("README.md", "CHANGELOG.md", "Makefile", "Dockerfile", ".env.example", "pyproject.toml", "docker-compose.yml")
TEXT_SUFFIXES = {".py", ".md", ".sql", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".ini", ".sh", ""}
# "SPEC §9.1", "SPEC.md", "issue 12", "issues 10–13", "Issue 11's", "issue #4".
OUTSIDE = re.compile(r"\bSPEC\b|\b[Ii]ssues? #?\d")


def text_files() -> Iterator[Path]:
    for name in FILES:
        if (ROOT / name).is_file():
            yield ROOT / name
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in TEXT_SUFFIXES:
                yield path


def outside_references(text: str) -> list[str]:
    return [f"{number}: {line.strip()}" for number, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]


def test_nothing_points_at_the_specification_or_a_tracker_issue() -> None:
    files = [path for path in text_files() if path != Path(__file__).resolve()]
    assert len(files) > 200
    found = {str(path.relative_to(ROOT)): lines for path in files
             if (lines := outside_references(path.read_text(encoding="utf-8", errors="replace")))}
    assert found == {}


def test_the_check_sees_each_form() -> None:
    sample = "\n".join([
        '"""Order (SPEC §6.1): compatibility first."""',
        "# Inline keyboards (issue 12 §4 and §6)",
        "-- Journal states (issues 12 and 13).",
        "    '''Issue 11's break: the reply met RetryAfter.'''",
        "tissue 5, _SPECIAL, a specification, docs/operations.md \"Cleanup policy\"",
    ])
    assert [line.split(":")[0] for line in outside_references(sample)] == ["1", "2", "3", "4"]
