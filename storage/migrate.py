"""Migration runner: ``migrations/NNN_name.sql`` applied in order, tracked by ``PRAGMA user_version``.

Each file runs in its own ``BEGIN IMMEDIATE … COMMIT`` together with the version bump, so a failing
migration rolls back whole. The SQL files ship inside the distribution (package ``migrations``).
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
    for migration in migrations[current:]:
        script = f"BEGIN IMMEDIATE;\n{migration.sql}\nPRAGMA user_version = {migration.version};\nCOMMIT;"
        try:
            conn.executescript(script)
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise MigrationError(f"migration {migration.name} failed: {exc}") from exc
        current = migration.version
    return current
