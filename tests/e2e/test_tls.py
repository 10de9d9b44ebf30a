"""TLS for the bus with real processes (docs/operations.md, "TLS"): a leader with a certificate and key, `topicbus
follow` over wss:// trusting the self-signed certificate with --ca-file, `topicbus status` over
https:// with --ca-file and --secret-file; and the one startup notice for a bind without TLS."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from pathlib import Path

from tests.e2e.harness import CHAT_ID, OWNER_ID, SECRET, Cluster
from tests.support.certs import self_signed
from topicbus.follower.client import tls_client_context

NOTICE = "without TLS"


async def test_follow_and_status_over_tls_with_a_self_signed_certificate(cluster: Cluster, tmp_path: Path):
    cert, key = self_signed(tmp_path)
    cluster.env_overrides.update({"TOPICBUS_BUS_TLS_CERT": str(cert), "TOPICBUS_BUS_TLS_KEY": str(key),
                                  "TOPICBUS_LEADER_URL": f"wss://127.0.0.1:{cluster.port}/v1/bus"})
    leader = await cluster.start_leader()
    trusted = tls_client_context(cert)

    def health() -> int:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{cluster.port}/healthz", timeout=2,
                                        context=trusted) as resp:
                return resp.status
        except OSError:
            return 0

    await cluster.wait_for(lambda: _async(health), 20, "https /healthz answers 200")
    work = tmp_path / "agent"
    work.mkdir()
    follower = await cluster.spawn("follow-tls", ["follow", "--ca-file", str(cert), "--cwd", str(work), "--",
                                                  sys.executable, "-u", "-c", _ECHO])
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    thread = await cluster.wait_for(lambda: _thread_over_tls(cluster, cert, secret_file, work), 30,
                                    "the follower's topic, seen by `topicbus status` over https")
    await cluster.wait_text(thread, "agent ready")
    cluster.fake.push_message(CHAT_ID, "over tls", thread_id=thread, from_id=OWNER_ID)
    await cluster.wait_text(thread, "echo: over tls")
    assert NOTICE not in leader.log()
    assert follower.process.returncode is None


async def _async(fn):
    return (await asyncio.to_thread(fn)) == 200


async def _thread_over_tls(cluster: Cluster, cert: Path, secret_file: Path, work: Path) -> int | None:
    status = await cluster.spawn("status", ["status", "--json", "--ca-file", str(cert), "--secret-file",
                                            str(secret_file)], TOPICBUS_BUS_SECRET="")
    if await status.wait() != 0:
        return None
    snapshot = json.loads(status.log()[status.log().index("{"):])
    return next((b["threadId"] for b in snapshot["bindings"] if b["cwd"] == str(work) and b["state"] == "live"), None)


_ECHO = """
import sys
print("agent ready", flush=True)
for line in sys.stdin:
    print("echo: " + line.rstrip("\\n"), flush=True)
"""


async def test_a_bind_beyond_loopback_without_tls_says_so_once(cluster: Cluster):
    leader = await cluster.start_leader(TOPICBUS_BUS_HOST="0.0.0.0")
    await cluster.wait_polling()
    notices = [line for line in leader.log().splitlines() if NOTICE in line]
    assert len(notices) == 1, leader.log()
    assert "127.0.0.1:" in notices[0] and "TOPICBUS_BUS_TLS_CERT" in notices[0]


async def test_a_loopback_bind_without_tls_says_nothing(cluster: Cluster):
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    assert NOTICE not in leader.log()
