"""Health that tells the truth (docs/operations.md, "Health reasons"): ``/healthz`` is 503 with a reason while the poll loop
has not completed a batch within its deadline, while the lease cannot be refreshed, and while the
journal cannot be written; 200 again once that is over. One test per reason."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import contextmanager
from pathlib import Path

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster, recorded_lines
from tests.e2e.test_faults import start_recorded_follower


async def _health(cluster: Cluster) -> tuple[int, dict]:
    code, body = await asyncio.to_thread(cluster.http, "/healthz", secret=None)
    return code, body if isinstance(body, dict) else {}


def _reason(prefix: str):
    async def check(cluster: Cluster) -> list[str] | None:
        code, body = await _health(cluster)
        reasons = [r for r in body.get("reasons", []) if r.startswith(prefix)]
        return reasons if code == 503 and reasons else None
    return check


async def _healthy(cluster: Cluster) -> bool:
    code, body = await _health(cluster)
    return code == 200 and body.get("role") == "leader"


@contextmanager
def write_lock(cluster: Cluster):
    """An outside writer holding the database's write lock (BEGIN IMMEDIATE)."""
    conn = sqlite3.connect(str(cluster.db_path), timeout=10, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


async def test_healthz_is_503_while_no_poll_batch_completes_in_time(cluster: Cluster):
    # Poll timeout 1 s (harness): the deadline is 3.5 s at the least; getUpdates hangs for 10 s.
    await cluster.start_leader(TOPICBUS_HEALTH_POLL_DEADLINE_S="3")
    await cluster.wait_polling()
    assert await _healthy(cluster)
    cluster.fake.delay_next("getUpdates", seconds=10)
    reasons = await cluster.wait_for(lambda: _reason("polling:")(cluster), 10, "503 naming the poll loop")
    assert "no getUpdates batch completed" in reasons[0]
    await cluster.wait_for(lambda: _healthy(cluster), 20, "200 once getUpdates answers again")


async def test_healthz_is_503_while_the_lease_cannot_be_refreshed(cluster: Cluster):
    # Lease refreshed every 0.3 s, stale after 1.5 s (harness): a refresh missing for 0.75 s counts.
    await cluster.start_leader()
    await cluster.wait_polling()
    with write_lock(cluster):
        reasons = await cluster.wait_for(lambda: _reason("lease:")(cluster), 10, "503 naming the lease")
        code, body = await _health(cluster)
        assert not any(r.startswith("journal:") for r in body.get("reasons", [])), body  # no traffic
    assert reasons
    await cluster.wait_for(lambda: _healthy(cluster), 20, "200 once the lease is refreshed again")


async def test_healthz_is_503_while_the_journal_cannot_be_written(cluster: Cluster, tmp_path: Path):
    await cluster.start_leader()
    await cluster.wait_polling()
    out = tmp_path / "journal.stdin.txt"
    _, thread = await start_recorded_follower(cluster, tmp_path / "journal", out)
    await cluster.wait_text(thread, "agent ready")
    with write_lock(cluster):
        cluster.fake.push_message(CHAT_ID, "kept while the journal is locked", thread_id=thread, from_id=OWNER_ID)
        # The journal append gives up after SQLite's busy timeout (5 s) and its retries. When the lease
        # refresh met the lock first it holds the process's write lock for one busy wait (5 s), and the
        # journal's unit of work then tries BEGIN up to 8 times (storage/db.py, LOCKED_RETRY_ATTEMPTS):
        # about 51 s at worst, so the deadline is 60 s.
        reasons = await cluster.wait_for(lambda: _reason("journal:")(cluster), 60, "503 naming the journal")
        assert "cannot write" in reasons[0]
    await cluster.wait_for(lambda: recorded_lines(out) == ["kept while the journal is locked"], 20,
                           "the message delivered once the journal is writable")
    await cluster.wait_for(lambda: _healthy(cluster), 20, "200 once the journal is written again")
