"""Faults end to end (docs/reliability.md, "What is guaranteed"): real leader and follower processes, SIGKILL,
Telegram 429/5xx/network errors from the fake Bot API, a locked and an unwritable database."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, RECORDING_AGENT, Cluster, RawBus, recorded_lines

pytestmark = pytest.mark.e2e


async def start_recorded_follower(cluster: Cluster, work: Path, out: Path) -> tuple[Any, int]:
    proc = await cluster.start_follower(work, script=RECORDING_AGENT, AGENT_OUT=str(out))
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    return proc, thread


async def queued_for(cluster: Cluster, work: Path) -> int | None:
    snap = await cluster.status()
    if not snap:
        return None
    binding = next((b for b in snap["bindings"] if b["cwd"] == str(work)), None)
    return None if binding is None else binding["queued"]


def push(cluster: Cluster, thread: int, texts: list[str]) -> None:
    for text in texts:
        cluster.fake.push_message(CHAT_ID, text, thread_id=thread, from_id=OWNER_ID)


async def test_leader_sigkill_during_inbound_burst_delivers_each_message_once_in_order(cluster: Cluster):
    """50 owner messages; the leader is SIGKILLed while they are being routed and a new leader takes over.

    The burst is pushed in three parts so the kill lands mid-burst whatever the machine's speed:
    part one is being delivered (the agent has seen at least one message), part two is pushed
    right before the kill (routed or not, receipts in flight), part three arrives while no leader runs.
    """
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    work, out = cluster.tmp / "burst", cluster.tmp / "burst.stdin.txt"
    _, thread = await start_recorded_follower(cluster, work, out)
    await cluster.wait_text(thread, "agent ready")
    messages = [f"burst {i:02d}" for i in range(50)]

    push(cluster, thread, messages[:20])
    await cluster.wait_for(lambda: len(recorded_lines(out)) >= 1, message="the burst reaching the agent")
    push(cluster, thread, messages[20:30])
    leader.kill(signal.SIGKILL)
    await leader.wait()
    push(cluster, thread, messages[30:])

    await cluster.start_leader()
    await cluster.wait_polling()
    await cluster.wait_for(lambda: len(recorded_lines(out)) >= 50, timeout=30, message="all 50 messages")
    # Once every receipt is journaled nothing can be redelivered any more: the record is final.
    await cluster.wait_for(lambda: _is_zero(queued_for(cluster, work)), message="every receipt journaled")
    assert recorded_lines(out) == messages  # exactly once, in order


async def _is_zero(value) -> bool:
    return (await value) == 0


async def test_follower_sigkill_mid_delivery_redelivers_everything_unacknowledged(cluster: Cluster):
    """The follower's process group is SIGKILLed while deliveries are on the wire, unacknowledged.

    To make "mid-delivery" deterministic the group is first SIGSTOPped: messages routed after
    that are sent to its socket but can never be receipted. The restarted follower (same --cwd;
    cleanup off so the preserved topic is reclaimed) must receive every one of those, plus the
    ones that arrived while it was dead, and none of the ones the first agent acknowledged.
    """
    await cluster.start_leader(TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_polling()
    work = cluster.tmp / "victim"
    out1, out2 = cluster.tmp / "victim-1.stdin.txt", cluster.tmp / "victim-2.stdin.txt"
    first, thread = await start_recorded_follower(cluster, work, out1)
    await cluster.wait_text(thread, "agent ready")
    acked = [f"acked {i:02d}" for i in range(10)]
    in_flight = [f"in flight {i:02d}" for i in range(15)]
    while_dead = [f"while dead {i:02d}" for i in range(10)]

    push(cluster, thread, acked)
    await cluster.wait_for(lambda: recorded_lines(out1) == acked, message="first agent got the first batch")
    await cluster.wait_for(lambda: _is_zero(queued_for(cluster, work)), message="first batch acknowledged")

    os.killpg(first.pid, signal.SIGSTOP)
    push(cluster, thread, in_flight)
    await cluster.wait_for(lambda: _equals(queued_for(cluster, work), len(in_flight)), timeout=10,
                           message="in-flight batch journaled, unacknowledged")
    os.killpg(first.pid, signal.SIGKILL)
    await first.wait()
    push(cluster, thread, while_dead)

    await cluster.start_follower(work, script=RECORDING_AGENT, AGENT_OUT=str(out2))
    await cluster.wait_for(lambda: len(recorded_lines(out2)) >= len(in_flight) + len(while_dead), timeout=30,
                           message="redelivery to the restarted follower")
    await cluster.wait_for(lambda: _is_zero(queued_for(cluster, work)), message="all receipts journaled")
    assert recorded_lines(out1) == acked  # the stopped agent consumed nothing more
    assert recorded_lines(out2) == in_flight + while_dead  # nothing lost, nothing acknowledged twice
    snap = await cluster.status()
    binding = next(b for b in snap["bindings"] if b["cwd"] == str(work))
    assert binding["threadId"] == thread and binding["state"] == "live"


async def _equals(value, expected: int) -> bool:
    return (await value) == expected


FLOOD_WAIT_S = 2


async def test_telegram_429_5xx_and_network_errors_on_output(cluster: Cluster):
    """Follower output survives 429 (retry_after honoured: the whole chat waits, since Telegram's
    flood control is per chat), 502 and a dropped connection, in order, without a busy loop; a topic
    backing off from an ambiguous failure holds up no other."""
    await cluster.start_leader(TOPICBUS_FOLLOWER_STALE_AFTER_MS="60000")
    await cluster.wait_polling()
    a_bus, b_bus, c_bus = await RawBus.connect(cluster), await RawBus.connect(cluster), await RawBus.connect(cluster)
    try:
        a, a_target = await a_bus.register(str(cluster.tmp / "out-a"))
        b, b_target = await b_bus.register(str(cluster.tmp / "out-b"))
        c, c_target = await c_bus.register(str(cluster.tmp / "out-c"))
        ta, tb, tc = a_target["threadId"], b_target["threadId"], c_target["threadId"]
        fake = cluster.fake
        first_call = len(fake.calls)

        def in_topic(thread: int):
            return lambda params: params.get("message_thread_id") == thread

        def sends(thread: int | None = None) -> list:
            return [call for call in fake.calls[first_call:] if call.method == "sendMessage"
                    and (thread is None or call.params.get("message_thread_id") == thread)]

        # Topic C hits flood control: Telegram says the chat must wait FLOOD_WAIT_S.
        fake.fail_next("sendMessage", status=429, retry_after=FLOOD_WAIT_S, when=in_topic(tc))
        assert (await c_bus.send_text(c, "c-out 0", "c-0"))["ok"] is True
        await cluster.wait_for(lambda: sends(tc), message="topic C's first attempt")
        flood_at = sends(tc)[0].at

        # Topic A then meets a 502 and a dropped connection (ambiguous: A backs off alone).
        fake.fail_next("sendMessage", status=502, when=in_topic(ta))
        fake.drop_next("sendMessage", when=in_topic(ta))
        injected = 2
        a_texts, b_texts = [f"a-out {i}" for i in range(5)], [f"b-out {i}" for i in range(5)]
        for i, text in enumerate(a_texts):
            assert (await a_bus.send_text(a, text, f"a-{i}"))["ok"] is True
        for i, text in enumerate(b_texts):
            assert (await b_bus.send_text(b, text, f"b-{i}"))["ok"] is True

        await cluster.wait_for(lambda: cluster.lines_in(ta) == a_texts and cluster.lines_in(tb) == b_texts
                               and cluster.lines_in(tc) == ["c-out 0"], timeout=20,
                               message="all output of A, B and C delivered")
        # RetryAfter honoured: nothing went to the chat until the wait was over.
        after = [call.at - flood_at for call in sends()[1:]]
        assert min(after) >= FLOOD_WAIT_S - 0.1, after
        calls_a, calls_b = sends(ta), sends(tb)
        assert [c.status for c in calls_a[:2]] == [502, 0], [c.status for c in calls_a]
        assert len(calls_a) <= len(a_texts) + injected, [c.status for c in calls_a]  # no busy loop
        assert all(c.status == 200 for c in calls_b) and len(calls_b) <= len(b_texts)
        assert [c.status for c in sends(tc)] == [429, 200]

        # Nothing delivered is sent again: one more message per topic is the next and last to arrive.
        assert (await a_bus.send_text(a, "a-last", "a-last"))["ok"] is True
        assert (await b_bus.send_text(b, "b-last", "b-last"))["ok"] is True
        await cluster.wait_for(lambda: "a-last" in cluster.lines_in(ta) and "b-last" in cluster.lines_in(tb),
                               message="the last message in A and in B")
        assert cluster.lines_in(ta) == [*a_texts, "a-last"] and cluster.lines_in(tb) == [*b_texts, "b-last"]
        snap = await cluster.status()
        assert snap["outboxPending"] == 0
    finally:
        for bus in (a_bus, b_bus, c_bus):
            await bus.close()


async def test_database_locked_by_an_outside_writer(cluster: Cluster):
    """An outside BEGIN IMMEDIATE holds the write lock while an owner message arrives: the leader
    waits, then delivers it once the lock is released, and keeps running."""
    leader = await cluster.start_leader()
    await cluster.wait_polling()
    work, out = cluster.tmp / "locked", cluster.tmp / "locked.stdin.txt"
    _, thread = await start_recorded_follower(cluster, work, out)
    await cluster.wait_text(thread, "agent ready")

    conn = sqlite3.connect(str(cluster.db_path), timeout=10, isolation_level=None, check_same_thread=False)
    try:
        await asyncio.to_thread(conn.execute, "BEGIN IMMEDIATE")
        push(cluster, thread, ["while the database is locked"])
        # The leader has the update and is waiting for the write lock (it says so once its busy
        # timeout is over): the message cannot be journaled, so it is neither delivered nor confirmed.
        await cluster.wait_for(lambda: "database is locked by another writer; waiting" in leader.log(), timeout=30,
                               message="the leader waiting for the write lock")
        assert recorded_lines(out) == []
        assert any(u.get("message", {}).get("text") == "while the database is locked"
                   for u in cluster.fake.pending_updates())  # not confirmed to Telegram either
    finally:
        await asyncio.to_thread(conn.execute, "ROLLBACK")
        conn.close()

    await cluster.wait_for(lambda: recorded_lines(out) == ["while the database is locked"], timeout=20,
                           message="delivery after the lock is released")
    push(cluster, thread, ["after the lock"])
    await cluster.wait_for(lambda: recorded_lines(out) == ["while the database is locked", "after the lock"],
                           message="routing continues")
    assert leader.process.returncode is None
    code, health = await asyncio.to_thread(cluster.http, "/healthz", secret=None)
    assert code == 200 and health["role"] == "leader" and health["epoch"] == 1, health


async def test_unwritable_database_path_fails_with_one_clear_line(cluster: Cluster, tmp_path: Path):
    """TOPICBUS_DB_PATH that cannot be created: exit non-zero with one readable line naming the path.

    As root, permissions do not stop us (a 0o555 directory is writable), so the path is put under a
    regular file instead, which no user can create a directory in."""
    if os.geteuid() == 0:
        parent = tmp_path / "a-regular-file"
        parent.write_text("not a directory")
    else:
        parent = tmp_path / "read-only"
        parent.mkdir()
        parent.chmod(0o555)
    db_path = parent / "topicbus.sqlite3"
    leader = await cluster.start_leader(TOPICBUS_DB_PATH=str(db_path))
    rc = await leader.wait(timeout=20)
    output = leader.log()
    assert rc != 0, output
    assert "Traceback" not in output, output
    problem = [line for line in output.splitlines() if str(parent) in line]
    assert len(problem) == 1, output  # one clear line that names the database path
    assert not db_path.exists()
    assert cluster.fake.calls_to("getUpdates") == []  # it never started polling


async def test_leader_waits_for_telegram_at_startup_and_then_polls(cluster: Cluster):
    cluster.fake.fail_next("getMe", status=502, description="Bad Gateway", times=3)
    leader = await cluster.start_leader()
    await cluster.wait_polling(timeout=30)
    assert len(cluster.fake.calls_to("getMe")) >= 4
    assert leader.process.returncode is None


async def test_a_rejected_bot_token_exits_2_with_a_readable_line(cluster: Cluster):
    cluster.fake.fail_next("getMe", status=401, description="Unauthorized")
    leader = await cluster.start_leader()
    assert await leader.wait(timeout=30) == 2
    log = leader.log()
    assert "rejected TOPICBUS_BOT_TOKEN" in log and "Traceback" not in log
    assert cluster.fake.calls_to("getUpdates") == []


async def test_a_control_answer_under_flood_control_waits_without_holding_up_polling_and_is_never_lost(
        cluster: Cluster):
    """Once, the reply to /status met RetryAfter inside the handler, the poller retried the
    update (routing of every owner message stopped) and skipped it after 3 attempts, answer lost."""
    await cluster.start_leader()
    await cluster.wait_polling()
    work, out = cluster.tmp / "flooded", cluster.tmp / "flooded.stdin.txt"
    _, thread = await start_recorded_follower(cluster, work, out)
    await cluster.wait_text(thread, "agent ready")
    control = (await cluster.status())["controlThreadId"]
    fake = cluster.fake
    wait_s = 3
    fake.fail_next("sendMessage", status=429, retry_after=wait_s,
                   when=lambda params: params.get("message_thread_id") == control)

    fake.push_message(CHAT_ID, "/status", thread_id=control, from_id=OWNER_ID)
    await cluster.wait_for(lambda: any(c.status == 429 for c in fake.calls_to("sendMessage")),
                           message="the answer to /status meeting flood control")
    push(cluster, thread, ["while the chat waits"])
    # Polling goes on: the owner's next message reaches its agent while the answer still waits.
    await cluster.wait_for(lambda: recorded_lines(out) == ["while the chat waits"], timeout=wait_s - 0.5,
                           message="routing during the RetryAfter wait")
    answers = [m for m in fake.messages_in(CHAT_ID, control) if (m.text or "").startswith("topicbus · leader")]
    assert answers == []
    # The answer is sent once the wait is over, exactly once, and the update was confirmed once.
    await cluster.wait_for(lambda: [m for m in fake.messages_in(CHAT_ID, control)
                                    if (m.text or "").startswith("topicbus · leader")], timeout=wait_s + 10,
                           message="the /status answer after the wait")
    assert len([m for m in fake.messages_in(CHAT_ID, control) if (m.text or "").startswith("topicbus · leader")]) == 1
    assert fake.pending_updates() == []
