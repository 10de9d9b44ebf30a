"""A follower that never reads holds nobody up (docs/operations.md, "Connection limits").

A raw client with a 4 KiB receive buffer registers, keeps heartbeating (so pruning is not what
saves the day) and never reads. The owner floods its topic with more than every buffer between the
leader and that socket can hold (sized from the kernel's tcp_wmem/tcp_rmem), then writes to a
legitimate follower and to the control topic. The legitimate follower answers, `/help` is answered,
the slow reader is disconnected by the write timeout, and when it comes back (reading, this time)
it gets every one of its messages.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from tests.e2e.harness import CHAT_ID, OWNER_ID, Cluster, register_frame
from tests.e2e.hostile import RawWebSocket, flood_size, heartbeats

RECEIVE_BUFFER = 4096
SEND_QUEUE_KB = 256
WRITE_TIMEOUT_S = 2.0
TEXT_CHARS = 4000  # one delivery frame is at least this many bytes


def _binding(snapshot: dict | None, cwd: str) -> dict | None:
    if not snapshot:
        return None
    return next((b for b in snapshot["bindings"] if b["cwd"] == cwd), None)


async def test_a_follower_that_never_reads_freezes_nothing(cluster: Cluster, tmp_path: Path):
    env = {"TOPICBUS_BUS_WRITE_TIMEOUT_S": str(WRITE_TIMEOUT_S), "TOPICBUS_BUS_SEND_QUEUE_KB": str(SEND_QUEUE_KB)}
    cluster.env_overrides.update(env)
    _, _, echo_thread = await cluster.leader_with_follower(tmp_path / "echo")
    control_thread = (await cluster.status())["controlThreadId"]

    slow_cwd = str(tmp_path / "slow")
    slow = await asyncio.to_thread(RawWebSocket, cluster.port, receive_buffer=RECEIVE_BUFFER)
    assert await asyncio.to_thread(slow.handshake) == 101
    registration = register_frame(slow_cwd)
    reply = await asyncio.to_thread(slow.request, registration)
    assert reply["ok"], reply
    slow_thread = reply["result"]["threadId"]
    stop = threading.Event()
    beating = heartbeats(slow, registration, stop, interval_s=0.2)

    count = flood_size(TEXT_CHARS, receive_buffer=RECEIVE_BUFFER, send_queue_bytes=SEND_QUEUE_KB * 1024)
    for i in range(count):
        cluster.fake.push_message(CHAT_ID, f"{i:06d} " + "x" * (TEXT_CHARS - 7), thread_id=slow_thread,
                                  from_id=OWNER_ID)
    cluster.fake.push_message(CHAT_ID, "ping-after-flood", thread_id=echo_thread, from_id=OWNER_ID)
    cluster.fake.push_message(CHAT_ID, "/help", thread_id=control_thread, from_id=OWNER_ID)
    helps_before = len(cluster.texts_in(control_thread))

    # Deadline: the leader works through the whole flood first (getUpdates order); with 100 updates
    # per batch that is count/100 batches, each well under a second even on a busy 2-core box.
    budget = 20 + count / 100
    try:
        await cluster.wait_text(echo_thread, "echo: ping-after-flood", timeout=budget)
        await cluster.wait_for(lambda: len(cluster.texts_in(control_thread)) > helps_before, budget,
                               "/help answered in the control topic")
        code, health = await asyncio.to_thread(cluster.http, "/healthz", secret=None)
        assert code == 200, health

        # The slow reader is dropped by the write timeout (it heartbeats, so pruning is not what
        # drops it); its messages are all still journaled. Nothing is read before the drop.
        await cluster.wait_for(lambda: _offline(cluster, registration["instanceId"]), 10 + WRITE_TIMEOUT_S * 5,
                               "the slow reader disconnected")
        how = await asyncio.to_thread(slow.wait_closed)
        assert how in ("reset", "eof") or how.startswith("close frame"), how
        assert "did not read" in cluster.procs[0].log()
        await cluster.wait_for(lambda: _queued(cluster, slow_cwd, count), 10,
                               f"all {count} messages of the slow reader still queued")
    finally:
        stop.set()
        beating.join(timeout=5)
        slow.close()

    # It comes back, reading this time: every message, once each, in order.
    back = await asyncio.to_thread(RawWebSocket, cluster.port)
    stop = threading.Event()
    try:
        assert await asyncio.to_thread(back.handshake) == 101
        again = register_frame(slow_cwd, hostId=registration["hostId"])
        assert (await asyncio.to_thread(back.request, again))["ok"]
        beating = heartbeats(back, again, stop, interval_s=0.2)
        texts = await asyncio.wait_for(asyncio.to_thread(_receive_all, back, again, count), budget)
        assert [t[:6] for t in texts] == [f"{i:06d}" for i in range(count)]
        await cluster.wait_for(lambda: _queued(cluster, slow_cwd, 0), 20, "receipts recorded")
    finally:
        stop.set()
        back.close()


async def _offline(cluster: Cluster, instance_id: str) -> bool:
    snapshot = await cluster.status()
    return snapshot is not None and not any(f["instanceId"] == instance_id and f["online"]
                                            for f in snapshot["followers"])


async def _queued(cluster: Cluster, cwd: str, expected: int) -> bool:
    binding = _binding(await cluster.status(), cwd)
    return binding is not None and binding["queued"] == expected


def _receive_all(ws: RawWebSocket, registration: dict, count: int) -> list[str]:
    """Read deliveries, acknowledging each, until ``count`` distinct ones arrived."""
    seen: dict[str, str] = {}
    while len(seen) < count:
        frame = ws.recv_json()
        if frame.get("kind") != "leader.deliver":
            continue
        ws.send_json({"kind": "bus.ack", "requestId": frame["deliveryId"], "ok": True})
        seen.setdefault(frame["deliveryId"], frame["item"]["text"])
    return list(seen.values())


async def test_pruning_a_follower_closes_its_connection(cluster: Cluster, tmp_path: Path):
    """A registered client that stops heartbeating and reading is pruned, and its socket is closed
    (before, the pruned follower's socket stayed open and a stuck write stayed stuck)."""
    await cluster.start_leader()
    await cluster.wait_polling()
    stale = await asyncio.to_thread(RawWebSocket, cluster.port, receive_buffer=RECEIVE_BUFFER, timeout=30)
    try:
        assert await asyncio.to_thread(stale.handshake) == 101
        registration = register_frame(str(tmp_path / "stale"))
        assert (await asyncio.to_thread(stale.request, registration))["ok"]

        async def pruned() -> bool:
            snapshot = await cluster.status()
            return snapshot is not None and all(f["instanceId"] != registration["instanceId"]
                                                for f in snapshot["followers"])

        # FOLLOWER_STALE_AFTER_MS is 1.5 s in the harness, pruning runs every 0.2 s.
        await cluster.wait_for(pruned, 15, "the stale follower pruned")
        how = await asyncio.to_thread(stale.wait_closed)  # fails with a socket timeout while it stays open
        assert how == "close frame 4002" or how in ("reset", "eof"), how
    finally:
        stale.close()
