"""One aiosqlite connection (WAL) with serialised ``BEGIN IMMEDIATE`` write transactions.

Every leader-side mutation goes through :meth:`Database.write`. Passing ``authority`` makes the
transaction re-check the leader lease *inside* the commit, so a leader that lost its lease can
never publish a change ("authority": SPEC §5).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite
from loguru import logger

from topicbus.storage.migrate import apply_migrations

BUSY_TIMEOUT_MS = 5_000
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
LOCKED_RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)


class AuthorityLost(Exception):
    """The leader lease changed hands; the mutation was not published."""


class StorageUnavailable(Exception):
    """The database cannot be written (locked for too long, read-only, disk full)."""


@dataclass(frozen=True)
class Authority:
    """The lease a leader-side mutation was started under."""

    owner: str
    epoch: int


class _Reader:
    """Read helpers shared by the database and a write transaction (same connection)."""

    _conn: aiosqlite.Connection

    # One hop to aiosqlite's worker thread per call (execute + fetch in one go).
    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return list(await self._conn.execute_fetchall(sql, params))

    async def fetch_one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        rows = await self._conn.execute_fetchall(sql, params)
        return rows[0] if rows else None


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
    async def write(self, authority: Authority | None = None) -> AsyncIterator[Transaction]:
        """A serialised ``BEGIN IMMEDIATE`` transaction; commits on success, rolls back on error.

        ``SQLITE_BUSY`` from an outside writer is retried with backoff (beyond ``busy_timeout``)
        before :class:`StorageUnavailable` is raised. With ``authority`` the lease row is checked
        first and :class:`AuthorityLost` aborts the transaction.
        """
        async with self._write_lock:
            await self._begin()
            tx = Transaction(self._conn)
            try:
                if authority is not None:
                    row = await tx.fetch_one("SELECT owner, epoch FROM leader_lease WHERE id = 1")
                    if row is None or row["owner"] != authority.owner or row["epoch"] != authority.epoch:
                        raise AuthorityLost("leader lease changed hands")
                yield tx
            except BaseException:
                await self._rollback()
                raise
            try:
                await self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                await self._rollback()
                raise StorageUnavailable(f"commit failed: {exc}") from exc

    async def write_statement(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """One self-contained write statement in its own implicit transaction (one worker-thread
        hop). The statement must carry its own authority check (see ``JournalRepository``)."""
        async with self._write_lock:
            try:
                return list(await self._conn.execute_fetchall(sql, params))
            except sqlite3.OperationalError as exc:
                raise StorageUnavailable(f"write failed: {exc}") from exc

    async def _begin(self) -> None:
        for delay in (*LOCKED_RETRY_DELAYS_S, None):
            try:
                await self._conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or delay is None:
                    raise StorageUnavailable(f"cannot start a write transaction: {exc}") from exc
                logger.bind(phase="storage-busy").warning("database is locked by another writer; waiting")
                await asyncio.sleep(delay)

    async def _rollback(self) -> None:
        try:
            await self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


class Transaction(_Reader):
    """The handle a write transaction's body uses."""

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
        return apply_migrations(conn)
    except sqlite3.OperationalError as exc:
        raise StorageUnavailable(f"cannot prepare database {path}: {exc}") from exc
    finally:
        conn.close()


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text
