"""One aiosqlite connection (WAL) with serialised ``BEGIN IMMEDIATE`` write transactions.

Every write goes through a :class:`UnitOfWork`, and the only way to get one is
:meth:`Database.unit_of_work`, which requires the leader's :class:`Authority` and re-checks it
*inside* the transaction, before the body runs: a leader that lost its lease can never publish a
change (docs/architecture.md, "Storage: the unit of work"). The two exceptions are structural, not conventions: the lease row itself
(:meth:`Database.lease_transaction`, used only by ``storage/lease.py``) and migrations (run before
the connection opens). Reads refuse anything but ``SELECT``/``WITH`` (and reading a ``PRAGMA``), so there is no write path
around the unit of work (``tests/integration/test_storage.py`` checks all three).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
from loguru import logger

from topicbus.core.authority import Authority, AuthorityLost
from topicbus.retry import Backoff
from topicbus.storage.migrate import apply_migrations

BUSY_TIMEOUT_MS = 5_000
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
# Attempts at BEGIN IMMEDIATE while an outside writer holds the file; each waits up to busy_timeout,
# with pauses of 0.05 s doubling (to 3.2 s) between them. The process's write lock is held meanwhile.
LOCKED_RETRY_ATTEMPTS = 8


class StorageUnavailable(Exception):
    """The database cannot be written (locked for too long, read-only, disk full)."""


class DatabaseDamaged(StorageUnavailable):
    """The file is not a SQLite database, or SQLite finds it damaged (truncated, overwritten)."""

    def __init__(self, path: Path | str):
        super().__init__(f"database {path} is not a SQLite database or is damaged; "
                         "restore from backup (docs/operations.md#backups)")


def is_damage(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite reporting a damaged or foreign file (also when it surfaces late)."""
    if isinstance(exc, DatabaseDamaged):
        return True
    text = str(exc).lower()
    return isinstance(exc, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text)


class _Reader:
    """Read helpers shared by the database and a write transaction (same connection)."""

    _conn: aiosqlite.Connection
    _reads_only = True

    # One hop to aiosqlite's worker thread per call (execute + fetch in one go).
    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        if self._reads_only:
            _check_read(sql)
        return list(await self._conn.execute_fetchall(sql, params))

    async def fetch_one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        if self._reads_only:
            _check_read(sql)
        rows = await self._conn.execute_fetchall(sql, params)
        return next(iter(rows), None)


# A WITH clause may lead an INSERT, UPDATE, DELETE or REPLACE as well as a SELECT (SQLite's grammar):
# such a statement is a write, whatever it starts with. String literals are left out of the search.
_CTE_WRITE = re.compile(r"\b(INSERT|UPDATE|DELETE)\b|\bREPLACE\s+INTO\b", re.IGNORECASE)
_SQL_STRING = re.compile(r"'(?:[^']|'')*'")


def _check_read(sql: str) -> None:
    head = sql.lstrip()[:6].upper()
    if head.startswith("SELECT") or (head == "PRAGMA" and "=" not in sql):
        return
    if head.startswith("WITH") and not _CTE_WRITE.search(_SQL_STRING.sub("''", sql)):
        return
    raise PermissionError("writes go through Database.unit_of_work(authority); reads are SELECT/WITH only")


class Database(_Reader):
    def __init__(self, conn: aiosqlite.Connection, path: Path):
        self._conn = conn
        self._write_lock = asyncio.Lock()
        self.path = path

    @classmethod
    async def open(cls, path: str | Path, *, synchronous: str = "full") -> Database:
        """Open (creating and migrating) the database. ``synchronous`` is SQLite's durability level
        in WAL mode: ``full`` (default) survives power loss; ``normal`` survives process crashes only
        and skips the fsync per commit."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageUnavailable(f"cannot create the directory {path.parent}: {exc.strerror}") from None
        version = await asyncio.to_thread(_migrate_file, path)
        logger.debug("database {} at schema version {}", path.name, version)
        conn = await aiosqlite.connect(str(path), isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            conn.row_factory = aiosqlite.Row
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute(f"PRAGMA synchronous={_SYNCHRONOUS[synchronous]}")
            await conn.execute("PRAGMA foreign_keys=ON")
            await conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            return cls(conn, path)
        except BaseException:
            await conn.close()
            raise

    async def close(self) -> None:
        await self._conn.close()

    # --- reads ----------------------------------------------------------------------------------
    async def fetch_value(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = await self.fetch_one(sql, params)
        return None if row is None else row[0]

    # --- writes ---------------------------------------------------------------------------------
    @asynccontextmanager
    async def unit_of_work(self, authority: Authority) -> AsyncIterator[UnitOfWork]:
        """A serialised ``BEGIN IMMEDIATE`` transaction under ``authority``; commits on success,
        rolls back on error.

        The lease row is read first, inside the transaction: if owner or epoch changed,
        :class:`AuthorityLost` aborts it. ``SQLITE_BUSY`` from an outside writer is retried with
        backoff (beyond ``busy_timeout``) before :class:`StorageUnavailable` is raised.
        """
        if not isinstance(authority, Authority):
            raise TypeError("a unit of work needs the leader's Authority")
        async with self._transaction() as uow:
            row = await uow.fetch_one("SELECT owner, epoch FROM leader_lease WHERE id = 1")
            if row is None or row["owner"] != authority.owner or row["epoch"] != authority.epoch:
                raise AuthorityLost("leader lease changed hands")
            yield uow

    def lease_transaction(self, *, attempts: int = LOCKED_RETRY_ATTEMPTS) -> AbstractAsyncContextManager[UnitOfWork]:
        """The one write without an authority check: the lease row, which *is* the authority.
        Only ``storage/lease.py`` uses it. ``attempts=1``: one busy wait, for a periodic write whose
        next tick is its retry (so it never holds the write lock for several busy waits in a row)."""
        return self._transaction(attempts)

    @asynccontextmanager
    async def _transaction(self, attempts: int = LOCKED_RETRY_ATTEMPTS) -> AsyncIterator[UnitOfWork]:
        async with self._write_lock:
            try:
                await self._begin(attempts)
            except BaseException:
                # Cancelled while BEGIN was queued or running on aiosqlite's thread: it still runs
                # there, so the ROLLBACK queued behind it ends the transaction instead of leaving it
                # open on the shared connection for the next writer to trip over.
                await self._rollback()
                raise
            uow = UnitOfWork(self._conn)
            try:
                yield uow
            except BaseException:
                await self._rollback()
                raise
            try:
                await self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                await self._rollback()
                raise StorageUnavailable(f"commit failed: {exc}") from exc

    async def self_fenced_statement(self, sql: str, params: Sequence[Any], authority: Authority) -> list[sqlite3.Row]:
        """One write statement in its own implicit transaction (one worker-thread hop) that carries
        its own authority check: ``sql`` contains ``{authority_check}`` as its *last* placeholder,
        an expression that is true only while the lease row still names ``authority``."""
        if not isinstance(authority, Authority):
            raise TypeError("a self-fenced statement needs the leader's Authority")
        statement = sql.format(authority_check=AUTHORITY_CHECK)
        async with self._write_lock:
            try:
                return list(await self._conn.execute_fetchall(statement, [*params, authority.owner,
                                                                           authority.epoch]))
            except sqlite3.OperationalError as exc:
                raise StorageUnavailable(f"write failed: {exc}") from exc

    async def still_leader(self, authority: Authority) -> bool:
        row = await self.fetch_one("SELECT owner, epoch FROM leader_lease WHERE id = 1")
        return row is not None and (row["owner"], row["epoch"]) == (authority.owner, authority.epoch)

    async def _begin(self, attempts: int) -> None:
        backoff = Backoff(initial=0.05, maximum=3.2)
        while True:
            try:
                await self._conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or backoff.attempts + 1 >= attempts:
                    raise StorageUnavailable(f"cannot start a write transaction: {exc}") from exc
                logger.bind(phase="storage-busy").warning("database is locked by another writer; waiting")
                await backoff.sleep()

    async def _rollback(self) -> None:
        try:
            await self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


AUTHORITY_CHECK = "EXISTS (SELECT 1 FROM leader_lease WHERE id = 1 AND owner = ? AND epoch = ?)"


class UnitOfWork(_Reader):
    """The handle a write transaction's body uses; only :class:`Database` makes one."""

    _reads_only = False

    def __init__(self, conn: aiosqlite.Connection):
        self._conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; returns the number of rows it changed (one worker-thread hop)."""
        try:
            cur = await self._conn.execute(sql, params)
        except sqlite3.OperationalError as exc:
            raise StorageUnavailable(str(exc)) from exc
        return cur.rowcount

    async def insert(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one INSERT; returns the new row id."""
        try:
            cur = await self._conn.execute(sql, params)
        except sqlite3.OperationalError as exc:
            raise StorageUnavailable(str(exc)) from exc
        return int(cur.lastrowid or 0)


def _migrate_file(path: Path) -> int:
    try:
        conn = sqlite3.connect(str(path), isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise StorageUnavailable(f"cannot open database {path}: {exc}") from exc
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        # A damaged file is found now, with one readable line, not by a query in the middle of work.
        if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise DatabaseDamaged(path)
        return apply_migrations(conn)
    except sqlite3.OperationalError as exc:
        raise StorageUnavailable(f"cannot prepare database {path}: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        raise DatabaseDamaged(path) from exc
    finally:
        conn.close()


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text
