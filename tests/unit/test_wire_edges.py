"""Typed inside, wire at the edges: the use cases (``app/leader``), the domain core (``app/core``) and the
Telegram handlers (``handlers``) work on records (``core/records``, ``core/status``), never on wire
dicts. The camelCase field names of the bus protocol, the stored JSON and the status document appear
only at the edges that convert them: ``protocol.py``, ``storage/``, ``status_json.py`` (static check)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSIDE = (ROOT / "app" / "leader", ROOT / "app" / "core", ROOT / "handlers")
CAMEL_CASE = re.compile(r"[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+")


def camel_case_strings(path: Path) -> list[str]:
    """Every string literal of a module that is a camelCase name (``"dataBase64"``, ``'fileSize'``),
    docstrings left out, as ``line: "name"``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [f"{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and CAMEL_CASE.fullmatch(node.value)]


def test_no_wire_key_is_spelled_inside_the_edges() -> None:
    modules = sorted(p for folder in INSIDE for p in folder.rglob("*.py"))
    assert len(modules) > 50
    found = {str(p.relative_to(ROOT)): names for p in modules if (names := camel_case_strings(p))}
    assert found == {}


def test_the_check_sees_a_wire_key(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""A docstring may say ``fileSize``."""\n'
                      'def size(item):\n'
                      '    """Nor is ``"dataBase64"`` here a key."""\n'
                      '    return item.get("fileSize"), item["dataBase64"], f"{item}" , {"snake_case": 1, "x": "y"}\n')
    assert camel_case_strings(sample) == ["4: 'fileSize'", "4: 'dataBase64'"]
