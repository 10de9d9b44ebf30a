"""Connection hygiene on the bus port (docs/operations.md, "Connection limits").

Idle and half-open connections cannot exhaust the leader: connections that send no request head, no
registration or no pong are dropped by their deadlines, the oldest unauthenticated connection
makes room for a new one, and with ``ulimit -n 1024`` a flood of 1,100 idle connections leaves
``/healthz``, ``/v1/status`` and registration working. A header that is not UTF-8 is a 401.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster, register_frame
from tests.e2e.hostile import RawWebSocket, idle_connections, still_open

IDLE = 1_100
OPEN_FILES = 1_024


async def test_a_thousand_idle_connections_under_ulimit_1024_block_nobody(cluster: Cluster, tmp_path: Path):
    leader = await cluster.start_leader(open_files=OPEN_FILES)
    await cluster.wait_polling()
    await cluster.start_follower(tmp_path / "echo")
    echo_thread = (await cluster.wait_follower_topic(tmp_path / "echo"))["threadId"]
    await cluster.wait_text(echo_thread, "agent ready")
    log_before = len(leader.log())

    sockets = await asyncio.to_thread(idle_connections, cluster.port, IDLE)
    try:
        # Deadlines: each check is one request that the leader answers at once; the 2 s of the
        # harness's urllib timeout per try and 20 s in all leave room for a busy machine.
        await cluster.wait_for(lambda: _ok(cluster, "/healthz"), 20, "/healthz answers 200")
        await cluster.wait_for(lambda: _ok(cluster, "/v1/status"), 20, "/v1/status answers 200")

        newcomer = await asyncio.to_thread(RawWebSocket, cluster.port)
        try:
            assert await asyncio.to_thread(newcomer.handshake) == 101
            reply = await asyncio.to_thread(newcomer.request, register_frame(str(tmp_path / "newcomer")))
            assert reply["ok"], reply
        finally:
            newcomer.close()

        cluster.fake.push_message(CHAT_ID, "still there?", thread_id=echo_thread, from_id=OWNER_ID)
        await cluster.wait_text(echo_thread, "echo: still there?", timeout=20)

        # The idle connections were dropped (cap on unauthenticated connections), the leader kept
        # its descriptors, and the log did not fill with accept errors.
        assert await asyncio.to_thread(still_open, sockets) <= 64, "idle connections beyond the cap were kept"
        grown = leader.log()[log_before:]
        assert "out of system resource" not in grown and "Traceback" not in grown, grown[-2000:]
        assert len(grown) < 64 * 1024, f"the leader logged {len(grown)} bytes for {IDLE} idle connections"
    finally:
        for sock in sockets:
            sock.close()


async def _ok(cluster: Cluster, path: str) -> bool:
    code, _ = await asyncio.to_thread(cluster.http, path)
    return code == 200


async def test_a_connection_that_sends_nothing_is_closed_after_the_head_deadline(cluster: Cluster):
    await cluster.start_leader(TOPICBUS_BUS_HEAD_TIMEOUT_S="1")
    await cluster.wait_polling()
    sock = socket.create_connection(("127.0.0.1", cluster.port), timeout=15)
    try:
        # EOF (b"") or a reset once the 1 s deadline passed; a socket timeout (15 s) fails the test.
        try:
            data = await asyncio.to_thread(sock.recv, 1)
        except ConnectionResetError:
            data = b""
        assert data == b""
    finally:
        sock.close()


async def test_an_upgraded_connection_that_never_registers_is_closed(cluster: Cluster):
    await cluster.start_leader(TOPICBUS_BUS_REGISTER_TIMEOUT_S="1")
    await cluster.wait_polling()
    ws = await asyncio.to_thread(RawWebSocket, cluster.port, timeout=15)
    try:
        assert await asyncio.to_thread(ws.handshake) == 101
        assert await asyncio.to_thread(ws.wait_closed) == "close frame 1008"
    finally:
        ws.close()


async def test_a_half_open_peer_that_answers_no_ping_is_dropped(cluster: Cluster, tmp_path: Path):
    # Pruning is pushed far away, so only the ping deadline can drop the peer.
    await cluster.start_leader(TOPICBUS_BUS_PING_INTERVAL_S="1", TOPICBUS_FOLLOWER_STALE_AFTER_MS="60000")
    await cluster.wait_polling()
    ws = await asyncio.to_thread(RawWebSocket, cluster.port, timeout=15)
    try:
        assert await asyncio.to_thread(ws.handshake) == 101
        assert (await asyncio.to_thread(ws.request, register_frame(str(tmp_path / "quiet"))))["ok"]
        # From here on the peer sends nothing and reads without answering the leader's pings.
        assert await asyncio.to_thread(ws.wait_closed) in ("eof", "reset")
    finally:
        ws.close()


async def test_an_authorization_header_that_is_not_utf8_is_refused_with_401(cluster: Cluster):
    await cluster.start_leader()
    await cluster.wait_polling()
    for path in ("/v1/bus", "/v1/status"):
        ws = await asyncio.to_thread(RawWebSocket, cluster.port)
        try:
            assert await asyncio.to_thread(ws.handshake, b"\xff\xfe\xc3(", path) == 401
        finally:
            ws.close()
    assert "Traceback" not in cluster.procs[0].log()
