"""Migration runner: ``migrations/NNN_name.sql`` applied in order, tracked by ``PRAGMA user_version``.

The pending files run in one ``BEGIN IMMEDIATE … COMMIT`` with the version bumps: the schema moves
from its version to the newest at once or not at all, and a failing migration rolls back whole (with
the ones before it in the same run). One commit is one fsync: a new database is ready in about 10 ms
instead of 60 (seven migrations, a commit each). The SQL files ship inside the distribution
(package ``migrations``).
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


class MigrationError(Exception):
    pass


def discover(package: str = "topicbus.migrations") -> list[Migration]:
    found = []
    for entry in resources.files(package).iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise MigrationError(f"migration numbering has a gap or duplicate at {migration.name}")
    return found


def apply_migrations(conn: sqlite3.Connection, migrations: list[Migration] | None = None) -> int:
    """Apply every migration newer than ``user_version``; return the resulting version."""
    migrations = discover() if migrations is None else migrations
    current = conn.execute("PRAGMA user_version").fetchone()[0]
    if current > len(migrations):
        raise MigrationError(f"database schema version {current} is newer than this topicbus ({len(migrations)})")
    pending = migrations[current:]
    if not pending:
        return current
    conn.execute("BEGIN IMMEDIATE")
    try:
        for migration in pending:
            try:
                for statement in _statements(migration.sql):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {migration.version}")
            except sqlite3.Error as exc:
                raise MigrationError(f"migration {migration.name} failed: {exc}") from exc
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return pending[-1].version


def _statements(sql: str) -> list[str]:
    """The statements of a script, whole (``sqlite3.complete_statement`` knows triggers' ``END;``):
    ``executescript`` would commit the open transaction first."""
    statements: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer)
            buffer = ""
    rest = "\n".join(line for line in buffer.splitlines() if not line.strip().startswith("--")).strip()
    if rest:
        raise MigrationError(f"an unterminated statement: {rest[:80]!r}")
    return statements
