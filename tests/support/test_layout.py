"""The test layers stay separate: unit tests load no fake server and no harness (static check)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# What a unit test may not import: the fakes (aiohttp servers), the harnesses, aiohttp. (PTB's types
# — errors, filters, messages — are plain objects and may be used; no unit test talks HTTP.)
FORBIDDEN_IN_UNIT = ("tests.fakebotapi", "tests.fakeleader", "tests.integration", "tests.e2e", "tests.soak",
                     "tests.support.fake_telegram", "aiohttp")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def forbidden(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN_IN_UNIT))


def test_unit_tests_import_no_fake_server_and_no_harness() -> None:
    offenders = {str(p.relative_to(TESTS)): found for p in sorted((TESTS / "unit").rglob("*.py"))
                 if (found := forbidden(imported_modules(p)))}
    assert offenders == {}


def test_no_root_conftest_loads_fixtures_for_every_layer() -> None:
    assert not (TESTS / "conftest.py").exists(), "fixtures belong in the conftest.py of the layer that uses them"


def test_the_check_sees_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom tests.fakebotapi import FakeBotApi\nfrom aiohttp import web\n"
                      "def f():\n    import telegram.ext\n    from tests.e2e.harness import Cluster\n")
    assert forbidden(imported_modules(sample)) == ["aiohttp", "tests.e2e.harness", "tests.fakebotapi"]
