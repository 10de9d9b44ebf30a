"""The follower SDK's shape (docs/architecture.md): its modules use one another only through public
names, and its public surface is the one list ``topicbus.__all__`` (static check, then an import)."""

from __future__ import annotations

import ast
from pathlib import Path

import topicbus

FOLLOWER = Path(__file__).resolve().parents[2] / "app" / "follower"


def private_reach(source: str) -> list[str]:
    """Private names taken from another module or object: ``from topicbus.x import _y`` and
    ``other._y`` (``self._y`` and ``cls._y`` are a class's own business; dunders are not private)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("topicbus"):
            found += [f"import {node.module}.{a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(ast.unparse(node))
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_follower_modules_reach_into_no_private_name_of_another() -> None:
    modules = sorted(FOLLOWER.glob("*.py"))
    assert len(modules) > 10
    assert {p.name: found for p in modules if (found := private_reach(p.read_text()))} == {}


def test_the_check_sees_a_private_import_and_a_private_attribute() -> None:
    sample = ("from topicbus.follower.connection import BusConnection, _Conn\n"
              "class C:\n"
              "    def f(self, other):\n"
              "        return self._own, other._conn, self._connection._link, type(self).__name__\n")
    assert private_reach(sample) == ["import topicbus.follower.connection._Conn", "other._conn",
                                     "self._connection._link"]


def test_every_public_name_resolves_from_the_package() -> None:
    names = [n for n in topicbus.__all__ if n != "__version__"]
    assert "FollowerClient" in names and "Delivery" in names
    resolved = {name: getattr(topicbus, name) for name in names}
    assert {name: value.__name__ for name, value in resolved.items()} == {name: name for name in names}
    assert resolved["FollowerClient"].__module__ == "topicbus.follower.client"
    assert {value.__module__ for name, value in resolved.items() if name != "FollowerClient"} == {
        "topicbus.follower.model"}
