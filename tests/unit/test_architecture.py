"""The dependency rule of docs/architecture.md, checked statically: the domain core imports nothing of
topicbus but the core, and no adapter, storage, settings or logging library; the ports import only the
core and the protocol; the leader's use cases reach Telegram, the store and the bus through the ports
(only the composition root picks the adapters); the follower uses only small pure modules."""

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


PORTS = CORE.parent / "ports"
LEADER = CORE.parent / "leader"
# The adapters the leader's use cases know only through topicbus.ports (Telegram, the bus, the store;
# handlers/ is part of the Telegram adapter). The transcription endpoint (speech/) has no port yet.
ADAPTERS = ("topicbus.bot", "topicbus.bus", "topicbus.storage", "topicbus.handlers")
# docs/architecture.md: the composition root picks the adapters; nothing else in leader/ may.
COMPOSITION_ROOT = ("assembly.py", "process.py")


def adapters_in(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == a or n.startswith(a + ".") for a in ADAPTERS))


def test_the_use_cases_reach_telegram_the_store_and_the_bus_only_through_ports() -> None:
    modules = sorted(p for p in LEADER.glob("*.py") if p.name not in COMPOSITION_ROOT)
    assert len(modules) > 20
    assert {str(p.name): found for p in modules if (found := adapters_in(imports(p)))} == {}


def test_the_ports_depend_on_the_core_and_the_protocol_only() -> None:
    allowed = ("topicbus.core", "topicbus.ports", "topicbus.protocol")
    modules = sorted(PORTS.glob("*.py"))
    assert {p.name for p in modules} >= {"telegram.py", "store.py", "bus.py"}
    assert {str(p.name): found for p in modules
            if (found := sorted(n for n in imports(p) if n.startswith("topicbus")
                                and not any(n == a or n.startswith(a + ".") for a in allowed)))} == {}
    libraries = {str(p.name): found for p in modules
                 if (found := [n for n in offending(imports(p)) if not n.startswith("topicbus")])}
    assert libraries == {}


def test_the_check_sees_an_adapter_in_a_use_case(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from topicbus.storage.bindings import Binding\nimport topicbus.bot.gateway\n"
                      "from topicbus.ports.store import Store\nfrom topicbus.bus import server\n")
    assert adapters_in(imports(sample)) == ["topicbus.bot.gateway", "topicbus.bus", "topicbus.storage.bindings"]
