"""Storage on real SQLite files: migrations, transactions, the authority fence, the lease."""

from __future__ import annotations

import sqlite3

import pytest

from topicbus.core.authority import Authority, AuthorityLost
from topicbus.storage.db import Database
from topicbus.storage.lease import LeaseRepository
from topicbus.storage.migrate import Migration, MigrationError, apply_migrations, discover


def test_migrations_ship_in_the_package_and_create_the_domain_tables(tmp_path):
    migrations = discover()
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
    conn = sqlite3.connect(tmp_path / "x.sqlite3", isolation_level=None)
    assert apply_migrations(conn) == len(migrations)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    assert {"leader_lease", "workspace_bindings", "target_owners", "pending_cleanups", "retirement_intents",
            "admission_holds", "retirement_fence", "inbound_journal", "outbox", "runtime_settings"} <= tables
    assert apply_migrations(conn) == len(migrations)  # idempotent


def test_a_failing_migration_rolls_back_whole(tmp_path):
    conn = sqlite3.connect(tmp_path / "x.sqlite3", isolation_level=None)
    good = Migration(1, "001_a.sql", "CREATE TABLE a (x INTEGER);")
    bad = Migration(2, "002_b.sql", "ALTER TABLE a ADD COLUMN y INTEGER; INSERT INTO nowhere VALUES (1);")
    apply_migrations(conn, [good])
    with pytest.raises(MigrationError, match="002_b.sql"):
        apply_migrations(conn, [good, bad])
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    assert [r[1] for r in conn.execute("PRAGMA table_info(a)")] == ["x"]


def test_pending_migrations_apply_together_or_not_at_all(tmp_path):
    conn = sqlite3.connect(tmp_path / "x.sqlite3", isolation_level=None)
    first = Migration(1, "001_a.sql", "-- a table\nCREATE TABLE a (x INTEGER);\n")
    trigger = Migration(2, "002_t.sql", """CREATE TABLE log (x INTEGER);
CREATE TRIGGER a_logged AFTER INSERT ON a BEGIN
    INSERT INTO log VALUES (new.x);
END;
""")
    bad = Migration(3, "003_b.sql", "INSERT INTO nowhere VALUES (1);")
    with pytest.raises(MigrationError, match="003_b.sql"):
        apply_migrations(conn, [first, trigger, bad])
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM sqlite_schema").fetchone()[0] == 0
    assert apply_migrations(conn, [first, trigger]) == 2
    conn.execute("INSERT INTO a VALUES (7)")
    assert conn.execute("SELECT x FROM log").fetchall() == [(7,)]  # the trigger's body stayed whole


def test_a_migration_with_an_unterminated_statement_is_refused(tmp_path):
    conn = sqlite3.connect(tmp_path / "x.sqlite3", isolation_level=None)
    with pytest.raises(MigrationError, match="unterminated"):
        apply_migrations(conn, [Migration(1, "001_a.sql", "CREATE TABLE a (x INTEGER)")])
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0 and not conn.in_transaction


def test_a_database_newer_than_the_code_is_refused(tmp_path):
    conn = sqlite3.connect(tmp_path / "x.sqlite3", isolation_level=None)
    conn.execute("PRAGMA user_version = 99")
    with pytest.raises(MigrationError, match="newer"):
        apply_migrations(conn)


async def test_units_of_work_commit_or_roll_back_whole(tmp_path):
    db = await Database.open(tmp_path / "x.sqlite3")
    try:
        authority = await LeaseRepository(db).try_acquire("one", now_ms=1_000, stale_after_ms=8_000)
        async with db.unit_of_work(authority) as uow:
            await uow.execute("INSERT INTO runtime_settings VALUES ('a', '1', 0)")
        with pytest.raises(RuntimeError):
            async with db.unit_of_work(authority) as uow:
                await uow.execute("INSERT INTO runtime_settings VALUES ('b', '2', 0)")
                raise RuntimeError("boom")
        keys = [r["key"] for r in await db.fetch_all("SELECT key FROM runtime_settings")]
        assert keys == ["a"]
        assert await db.fetch_value("PRAGMA journal_mode") == "wal"
        assert await db.fetch_value("PRAGMA foreign_keys") == 1
    finally:
        await db.close()


async def test_the_authority_fence_refuses_a_leader_that_lost_its_lease(tmp_path):
    db = await Database.open(tmp_path / "x.sqlite3")
    try:
        leases = LeaseRepository(db)
        first = await leases.try_acquire("one", now_ms=1_000, stale_after_ms=8_000)
        assert first == Authority("one", 1)
        assert await leases.try_acquire("two", now_ms=5_000, stale_after_ms=8_000) is None  # still fresh
        second = await leases.try_acquire("two", now_ms=10_000, stale_after_ms=8_000)  # stale: taken over
        assert second == Authority("two", 2)
        with pytest.raises(AuthorityLost):
            async with db.unit_of_work(first) as uow:
                await uow.execute("INSERT INTO runtime_settings VALUES ('late', 'x', 0)")
        assert await db.fetch_value("SELECT COUNT(*) FROM runtime_settings") == 0
        # A WITH that reads stays a read, also when a string or a function names a write.
        assert await db.fetch_value("WITH t(a) AS (SELECT 'insert or delete') SELECT replace(a, 'or', '&') FROM t") \
            == "insert & delete"
        assert not await leases.refresh(first, 11_000)
        assert await leases.refresh(second, 11_000)
        await leases.release(second)
        assert await leases.try_acquire("three", now_ms=11_001, stale_after_ms=8_000) == Authority("three", 3)
    finally:
        await db.close()


async def test_an_outside_writer_is_waited_for(tmp_path):
    import asyncio

    path = tmp_path / "x.sqlite3"
    db = await Database.open(path)
    authority = await LeaseRepository(db).try_acquire("one", now_ms=1_000, stale_after_ms=8_000)
    outside = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        outside.execute("BEGIN IMMEDIATE")

        async def release_soon():
            await asyncio.sleep(0.3)
            outside.execute("COMMIT")

        releaser = asyncio.create_task(release_soon())
        async with db.unit_of_work(authority) as uow:  # blocks on the outside writer, then proceeds
            await uow.execute("INSERT INTO runtime_settings VALUES ('after', 'lock', 0)")
        await releaser
        assert await db.fetch_value("SELECT value FROM runtime_settings WHERE key = 'after'") == "lock"
    finally:
        outside.close()
        await db.close()


async def test_a_lease_refresh_under_an_outside_writer_waits_once_then_gives_the_write_lock_up(tmp_path):
    """The refresh job's next tick is its retry: it never holds the process's write lock through
    several busy waits, so a writer queued behind it (the journal) gets its own turn."""
    import asyncio

    from loguru import logger

    from topicbus.storage.db import StorageUnavailable

    path = tmp_path / "x.sqlite3"
    db = await Database.open(path)
    leases = LeaseRepository(db)
    authority = await leases.try_acquire("one", now_ms=1_000, stale_after_ms=8_000)
    retries: list[str] = []
    sink = logger.add(lambda m: retries.append(m), filter=lambda r: r["extra"].get("phase") == "storage-busy")
    outside = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        outside.execute("BEGIN IMMEDIATE")
        refresh = asyncio.create_task(leases.refresh(authority, now_ms=2_000))
        await asyncio.sleep(0)  # the refresh holds the write lock, its BEGIN waits on the thread

        async def next_writer() -> None:
            async with db.unit_of_work(authority) as uow:
                await uow.execute("INSERT INTO runtime_settings VALUES ('next', 'x', 0)")

        queued = asyncio.create_task(next_writer())
        with pytest.raises(StorageUnavailable):
            await asyncio.wait_for(refresh, 15)  # one busy wait (5 s), not eight
        assert retries == []  # it did not wait again while holding the lock
        outside.execute("COMMIT")
        await asyncio.wait_for(queued, 15)
        assert await db.fetch_value("SELECT value FROM runtime_settings WHERE key = 'next'") == "x"
    finally:
        logger.remove(sink)
        outside.close()
        await db.close()


async def test_a_writer_cancelled_while_its_begin_waits_leaves_no_transaction_open(tmp_path):
    import asyncio

    path = tmp_path / "x.sqlite3"
    db = await Database.open(path)
    authority = await LeaseRepository(db).try_acquire("one", now_ms=1_000, stale_after_ms=8_000)
    outside = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        outside.execute("BEGIN IMMEDIATE")  # our BEGIN IMMEDIATE now waits on aiosqlite's thread

        async def write(key: str) -> None:
            async with db.unit_of_work(authority) as uow:
                await uow.execute("INSERT INTO runtime_settings VALUES (?, 'x', 0)", (key,))

        waiting = asyncio.create_task(write("cancelled"))
        await asyncio.sleep(0)  # its first step queued the BEGIN
        waiting.cancel()
        outside.execute("COMMIT")  # the queued BEGIN now succeeds on the thread, after the cancel
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.wait_for(write("next"), 10)  # would fail: "cannot start a transaction within a transaction"
        keys = [r["key"] for r in await db.fetch_all("SELECT key FROM runtime_settings")]
        assert keys == ["next"]
    finally:
        outside.close()
        await db.close()


async def test_durability_level_is_configurable(tmp_path):
    full = await Database.open(tmp_path / "a.sqlite3")
    normal = await Database.open(tmp_path / "b.sqlite3", synchronous="normal")
    try:
        assert await full.fetch_value("PRAGMA synchronous") == 2  # FULL: fsync on every commit
        assert await normal.fetch_value("PRAGMA synchronous") == 1  # NORMAL: fsync at checkpoints
    finally:
        await full.close()
        await normal.close()


async def test_there_is_no_write_path_around_the_unit_of_work(tmp_path):
    db = await Database.open(tmp_path / "x.sqlite3")
    try:
        for sql in ("INSERT INTO runtime_settings VALUES ('x', 'y', 0)", "  update runtime_settings SET value = 1",
                    "DELETE FROM outbox", "PRAGMA user_version = 7", "REPLACE INTO runtime_settings VALUES (1,1,1)",
                    "WITH t(a) AS (SELECT 1) INSERT INTO runtime_settings SELECT 'k', a, 0 FROM t",
                    "with t(a) as (select 1)\ndelete from runtime_settings where key in (select a from t)",
                    "WITH t(a) AS (SELECT 'x') REPLACE INTO runtime_settings SELECT a, a, 0 FROM t"):
            with pytest.raises(PermissionError):
                await db.fetch_all(sql)
        with pytest.raises(TypeError):
            async with db.unit_of_work(None):  # type: ignore[arg-type]
                pass
        with pytest.raises(TypeError):
            await db.self_fenced_statement("DELETE FROM outbox WHERE {authority_check}", [], None)  # type: ignore[arg-type]
        assert await db.fetch_value("SELECT COUNT(*) FROM runtime_settings") == 0
        # A WITH that reads stays a read, also when a string or a function names a write.
        assert await db.fetch_value("WITH t(a) AS (SELECT 'insert or delete') SELECT replace(a, 'or', '&') FROM t") \
            == "insert & delete"
        assert await db.fetch_value("PRAGMA user_version") >= 1
    finally:
        await db.close()


def test_only_the_lease_and_the_journal_use_the_two_writes_that_carry_no_unit_of_work():
    """Structural check over the package: only storage/ talks to SQLite (imports sqlite3/aiosqlite,
    touches the connection); the raw transaction stays inside storage/db.py; the lease transaction is
    the lease repository's; the self-fenced statement is the journal's hot path and a hold's release. Everything else can
    only write through ``unit_of_work(authority)``."""
    import ast
    from pathlib import Path

    import topicbus
    import topicbus.storage as storage_pkg

    allowed = {"_transaction": {"storage/db.py"}, "lease_transaction": {"storage/db.py", "storage/lease.py"},
               "self_fenced_statement": {"storage/db.py", "storage/journal.py", "storage/admission.py"}}
    found: dict[str, set[str]] = {name: set() for name in allowed}
    sqlite_users: set[str] = set()
    roots = {"": Path(topicbus.__file__).parent, "storage/": Path(storage_pkg.__file__).parent}
    for prefix, root in roots.items():
        for path in root.rglob("*.py"):
            rel = prefix + str(path.relative_to(root))
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr in allowed:
                    found[node.attr].add(rel)
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n.split(".")[0] in ("sqlite3", "aiosqlite") for n in names):
                    sqlite_users.add(rel)
    for name, files in found.items():
        assert files <= allowed[name], f"{name} used outside {allowed[name]}: {files - allowed[name]}"
    assert sqlite_users and all(rel.startswith("storage/") for rel in sqlite_users), sqlite_users
