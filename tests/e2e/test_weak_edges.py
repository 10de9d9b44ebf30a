"""Weak edges: a damaged database is one readable line and exit 2; `topicbus status`
takes the secret from a file and warns when it is given on the command line."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.e2e.harness import SECRET, Cluster

DAMAGED = "is not a SQLite database or is damaged; restore from backup (docs/operations.md#backups)"


async def _one_line_exit_2(cluster: Cluster) -> None:
    leader = await cluster.start_leader()
    rc = await leader.wait(timeout=20)
    log = leader.log()
    assert rc == 2, log
    assert "Traceback" not in log, log
    lines = [line for line in log.splitlines() if DAMAGED in line]
    assert lines == [f"topicbus: database {cluster.db_path} {DAMAGED}"], log
    assert cluster.fake.calls_to("getUpdates") == []


async def test_a_file_that_is_not_a_database_is_one_line_and_exit_2(cluster: Cluster):
    cluster.db_path.write_bytes(b"this is not a database, it is a shopping list\n" * 200)
    await _one_line_exit_2(cluster)


async def test_a_truncated_database_is_one_line_and_exit_2(cluster: Cluster):
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    leader.kill(signal.SIGTERM)
    assert await leader.wait() == 0
    for suffix in ("-wal", "-shm"):
        Path(str(cluster.db_path) + suffix).unlink(missing_ok=True)
    data = cluster.db_path.read_bytes()
    assert len(data) > 8192
    cluster.db_path.write_bytes(data[: len(data) // 2])  # a copy cut short
    cluster.fake.reset_calls()
    await _one_line_exit_2(cluster)


async def test_status_reads_the_secret_from_a_file_and_warns_about_secret_on_the_command_line(
        cluster: Cluster, tmp_path: Path):
    await cluster.start_leader()
    await cluster.wait_polling()
    secret_file = tmp_path / "bus-secret"
    secret_file.write_text(SECRET + "\n")

    status = await cluster.spawn("status-file", ["status", "--json", "--secret-file", str(secret_file)],
                                 TOPICBUS_BUS_SECRET="")
    assert await status.wait() == 0, status.log()
    assert json.loads(status.log())["role"] == "leader"
    assert "warning" not in status.log()

    status = await cluster.spawn("status-argv", ["status", "--json", "--secret", SECRET], TOPICBUS_BUS_SECRET="")
    assert await status.wait() == 0, status.log()
    log = status.log()
    assert "warning: --secret is visible to every user" in log
    assert json.loads(log[log.index("{"):])["role"] == "leader"

    status = await cluster.spawn("status-missing", ["status", "--secret-file", str(tmp_path / "nope")])
    assert await status.wait() == 2
    assert "--secret-file: cannot read" in status.log() and SECRET not in status.log()
