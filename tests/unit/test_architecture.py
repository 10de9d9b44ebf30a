"""The dependency rule of docs/architecture.md, checked statically: the domain core imports nothing of
topicbus but the core, and no adapter, storage, settings or logging library (static check)."""

from __future__ import annotations

from pathlib import Path

from tests.support.test_layout import imported_modules as imports

CORE = Path(__file__).resolve().parents[2] / "app" / "core"
# Outside the core: the adapters' libraries, storage, settings, logging, processes and sockets.
FORBIDDEN_IN_CORE = ("aiohttp", "aiosqlite", "sqlite3", "telegram", "apscheduler", "httpx", "pydantic",
                     "pydantic_settings", "loguru", "socket", "subprocess", "prometheus_client")


def offending(names: set[str]) -> list[str]:
    bad = [n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN_IN_CORE)]
    bad += [n for n in names if n.startswith("topicbus") and not n.startswith("topicbus.core")]
    return sorted(bad)


def test_the_core_depends_on_nothing_but_itself_and_pure_libraries() -> None:
    modules = sorted(CORE.glob("*.py"))
    assert len(modules) > 10
    assert {str(p.name): found for p in modules if (found := offending(imports(p)))} == {}


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import sqlite3\nfrom topicbus.leader.term import LeaderTerm\nfrom topicbus.core.target import Target\n")
    assert offending(imports(sample)) == ["sqlite3", "topicbus.leader.term"]


FOLLOWER = CORE.parent / "follower"
# docs/architecture.md: the follower side runs on agent machines without the leader's stack.
FOLLOWER_MAY_USE = ("topicbus.follower", "topicbus.protocol", "topicbus.retry", "topicbus.host", "topicbus.logsetup",
                    "topicbus.metadata")


def test_the_follower_uses_only_the_protocol_and_small_pure_modules() -> None:
    def foreign(names: set[str]) -> list[str]:
        return sorted(n for n in names if n.startswith("topicbus")
                      and not any(n == m or n.startswith(m + ".") for m in FOLLOWER_MAY_USE))

    modules = sorted(FOLLOWER.glob("*.py"))
    assert len(modules) > 5
    assert {str(p.name): found for p in modules if (found := foreign(imports(p)))} == {}
    # The one cleaning function for Telegram metadata is shared with the leader: it imports nothing
    # of topicbus, so both sides may use it.
    assert [n for n in imports(CORE.parent / "metadata.py") if n.startswith("topicbus")] == []
