"""How agent output reaches the topic (README, "How output looks in Telegram"), on a leader with its real outbound scheduler and
the fake Bot API: long output as one text file with the last lines as its caption, a stream's
messages silent and ended by one notifying "✓" line, the follower's outbox cap answered with
backlog-full and nothing stored, and topics served in turn when the budget is short."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest

from topicbus.core.target import Target
from topicbus.core.budget import BudgetConfig
from topicbus.core.output import OutputConfig
from topicbus.protocol import ErrorCode, ProtocolError, SendRequest, decode_frame, encode, send_frame, text_message
from tests.integration.leader_env import CHAT, Hold, LeaderEnv


async def _send(env: LeaderEnv, instance: str, generation: str, text: str, request: str) -> None:
    assert env.services is not None
    model = decode_frame(encode(send_frame(request, instance, generation, text_message(text))))
    assert isinstance(model, SendRequest)
    await env.services.followers.send(model)


def _output(env: LeaderEnv, **changes) -> None:
    env.outbound_options = dataclasses.replace(env.outbound_options,
                                               output=dataclasses.replace(OutputConfig(), **changes))


async def test_long_output_is_one_file_with_the_last_lines_as_its_caption(env: LeaderEnv):
    _output(env, file_threshold=2_000)
    await env.start()
    thread = (await env.register("a", cwd="/long", generation="g1", pid=10))["threadId"]
    lines = [f"line {i:04d} " + "x" * 40 for i in range(200)]  # about 10,000 characters
    for i in range(0, 200, 20):
        await _send(env, "a", "g1", "\n".join(lines[i:i + 20]), f"r{i}")
    await env.fake.wait_for(lambda: [m for m in env.fake.messages_in(CHAT, thread) if m.kind == "document"],
                            timeout=10)
    [document] = [m for m in env.fake.messages_in(CHAT, thread) if m.kind == "document"]
    assert re.fullmatch(r"output-\d{6}\.txt", document.document_name or "")
    assert document.document_bytes.decode().split("\n") == lines  # everything, in order, once
    assert document.caption.rstrip().endswith(lines[-1]) and lines[0] not in document.caption  # the tail
    assert [e["type"] for e in document.entities] == ["pre"]  # the caption's preview, monospace
    assert [m for m in env.fake.messages_in(CHAT, thread) if m.kind == "text" and "line 0" in (m.text or "")] == []


async def test_a_stream_is_silent_and_ends_with_one_notifying_line(env: LeaderEnv):
    _output(env, quiet_ms=300, live_window_ms=0)  # no growing message: each turn a message of its own
    await env.start()
    thread = (await env.register("a", cwd="/stream", generation="g1", pid=10))["threadId"]
    await _send(env, "a", "g1", "build started", "r0")
    await env.fake.wait_for(lambda: len(env.fake.messages_in(CHAT, thread)) == 1, timeout=10)
    for i in range(1, 4):  # more output within the quiet time: the same burst
        await _send(env, "a", "g1", f"step {i}", f"r{i}")
        await env.fake.wait_for(lambda n=i: len(env.fake.messages_in(CHAT, thread)) >= n + 1, timeout=10)
    await env.fake.wait_for(lambda: (env.fake.messages_in(CHAT, thread)[-1].text or "").startswith("✓"), timeout=10,
                            message="the line that ends the stream")
    messages = env.fake.messages_in(CHAT, thread)
    assert [(m.text, m.silent) for m in messages] == [("build started", False), ("step 1", True), ("step 2", True),
                                                      ("step 3", True), ("✓ step 3", False)]


async def test_the_outbox_cap_answers_backlog_full_and_stores_nothing(env: LeaderEnv):
    env.outbound_options = dataclasses.replace(env.outbound_options, max_items=3)
    await env.start()
    await env.register("a", cwd="/capped", generation="g1", pid=10)
    env.fake.set_flood_limit(0, retry_after=30)  # Telegram takes nothing: the outbox fills up
    for i in range(3):
        await _send(env, "a", "g1", f"kept {i}", f"r{i}")
    with pytest.raises(ProtocolError) as refused:
        await _send(env, "a", "g1", "one too many", "r3")
    assert refused.value.code == ErrorCode.BACKLOG_FULL
    texts = [r["text"] for r in await env.db.fetch_all("SELECT json_extract(payload, '$.text') AS text FROM outbox")]
    assert "one too many" not in texts and sum(t.startswith("kept") for t in texts) == 3


async def test_topics_take_turns_when_the_budget_is_short(env: LeaderEnv):
    env.outbound_options = dataclasses.replace(env.outbound_options,
                                               budget=BudgetConfig(per_minute=100_000, per_second=5,
                                                                   overall_per_second=10_000),
                                               output=OutputConfig(coalesce=False))  # one message per item
    await env.start()
    a = (await env.register("a", cwd="/a", generation="g1", pid=10))["threadId"]
    b = (await env.register("b", cwd="/b", generation="g1", pid=11))["threadId"]
    for i in range(6):  # a chatty agent queues first ...
        await _send(env, "a", "g1", f"a{i}", f"a{i}")
    await _send(env, "b", "g1", "b0", "b0")  # ... the other then says one thing
    await env.fake.wait_for(lambda: len(env.fake.messages_in(CHAT, b)) == 1, timeout=10)
    order = [m.thread_id for m in env.fake.sent if m.thread_id in (a, b)]
    assert order.index(b) <= 2  # served in turn, not after the whole backlog of the first topic


async def test_a_topic_waiting_to_settle_holds_back_only_its_own_output(env: LeaderEnv):
    """Steps of different topics overlap (one Telegram call at a time): while one topic's sent message
    waits to be marked sent (the database's write lock is held), another topic's output still goes out;
    the waiting topic's next message does not, and afterwards each went out once, in order."""
    _output(env, coalesce=False)  # one message per item
    await env.start()
    a = (await env.register("a", cwd="/a", generation="g1", pid=10))["threadId"]
    b = (await env.register("b", cwd="/b", generation="g1", pid=11))["threadId"]
    assert env.db is not None and env.authority is not None
    held = Hold(env.fake, "sendMessage")
    await _send(env, "a", "g1", "a0", "a0")
    await env.fake.wait_for(held.entered.is_set, timeout=10, message="a0 on the wire")
    await _send(env, "a", "g1", "a1", "a1")
    await _send(env, "b", "g1", "b0", "b0")
    writes_held, writes_free = asyncio.Event(), asyncio.Event()

    async def hold_writes() -> None:
        async with env.db.unit_of_work(env.authority):  # type: ignore[union-attr]
            writes_held.set()
            await writes_free.wait()

    holder = asyncio.create_task(hold_writes())
    try:
        await asyncio.wait_for(writes_held.wait(), 10)
        held.release.set()  # a0 is answered; marking it sent waits for the write lock
        await env.fake.wait_for(lambda: [m.text for m in env.fake.messages_in(CHAT, b)] == ["b0"], timeout=10,
                                message="the other topic's output while a0 waits to be settled")
        assert [m.text for m in env.fake.messages_in(CHAT, a)] == ["a0"]  # a1 waits for a0's settlement
    finally:
        writes_free.set()
        await holder
    await env.fake.wait_for(lambda: [m.text for m in env.fake.messages_in(CHAT, a)] == ["a0", "a1"], timeout=10)
    assert [m.text for m in env.fake.messages_in(CHAT, b)] == ["b0"]
    await env.fake.wait_for(lambda: env.services is not None and not env.services.outbound.backlog(), timeout=10)
    rows = await env.db.fetch_all("SELECT status, COUNT(*) AS n FROM outbox GROUP BY status")
    assert {r["status"]: r["n"] for r in rows}.get("pending", 0) == 0


async def test_output_sent_while_the_owner_spoke_is_never_grown_to_hold_the_answer(env: LeaderEnv):
    """The owner writes while the agent's message is on its way (it lands above the owner's on the
    phone): the agent's next output is a new notifying message below, not an edit of that one."""
    _output(env, edit_interval_ms=50)  # a live message would be grown at once
    await env.start()
    thread = (await env.register("a", cwd="/race", generation="g1", pid=10))["threadId"]
    held = Hold(env.fake, "sendMessage")
    await _send(env, "a", "g1", "READY", "r0")
    await env.fake.wait_for(held.entered.is_set, timeout=10, message="READY on the wire")
    assert env.services is not None
    env.services.outbound.owner_spoke(Target(CHAT, thread))  # what the turn handler does for the owner's "hello"
    held.release.set()
    await env.fake.wait_for(lambda: not env.services.outbound.backlog(), timeout=10, message="READY settled")
    await _send(env, "a", "g1", "got:hello", "r1")
    await env.fake.wait_for(lambda: any("got:hello" in text for m in env.fake.messages_in(CHAT, thread)
                                        for _, text in m.history), timeout=10, message="the answer")
    messages = env.fake.messages_in(CHAT, thread)
    assert [(m.text, m.silent, m.edits) for m in messages] == [("READY", False, 0), ("got:hello", False, 0)]


async def _send_tail(env: LeaderEnv, instance: str, generation: str, text: str, request: str) -> None:
    assert env.services is not None
    message = {**text_message(text), "tail": True}  # tail-v1: a line still being redrawn
    model = decode_frame(encode(send_frame(request, instance, generation, message)))
    assert isinstance(model, SendRequest)
    await env.services.followers.send(model)


async def test_a_tail_is_replaced_by_what_follows_it_in_the_live_message(env: LeaderEnv):
    _output(env, edit_interval_ms=200, quiet_ms=60_000)
    await env.start()
    thread = (await env.register("a", cwd="/bar", generation="g1", pid=10))["threadId"]
    await _send(env, "a", "g1", "starting", "r0")
    await env.fake.wait_for(lambda: env.fake.messages_in(CHAT, thread), timeout=10)
    [message] = env.fake.messages_in(CHAT, thread)
    for n, percent in enumerate((10, 40, 70)):
        await _send_tail(env, "a", "g1", f"bar {percent}%", f"t{n}")
        await env.fake.wait_for(lambda p=percent: (message.text or "").endswith(f"bar {p}%"), timeout=10)
        assert message.text == f"starting\nbar {percent}%"  # the tail replaced, never appended
    await _send_tail(env, "a", "g1", "bar 90%", "t3")  # followed at once: replaced whether or not it was shown
    await _send(env, "a", "g1", "bar 100%\nDone", "r1")
    await env.fake.wait_for(lambda: (message.text or "").endswith("Done"), timeout=10)
    assert message.text == "starting\nbar 100%\nDone"
    assert len(env.fake.messages_in(CHAT, thread)) == 1


async def test_a_message_that_held_only_a_tail_is_replaced_by_the_finished_line(env: LeaderEnv):
    _output(env, edit_interval_ms=200, quiet_ms=60_000)
    await env.start()
    thread = (await env.register("a", cwd="/bar", generation="g1", pid=10))["threadId"]
    await _send_tail(env, "a", "g1", "bar 10%", "t0")  # the program's first output is a bar being drawn
    await env.fake.wait_for(lambda: env.fake.messages_in(CHAT, thread), timeout=10)
    [message] = env.fake.messages_in(CHAT, thread)
    await _send(env, "a", "g1", "bar 100%\nDone", "r1")
    await env.fake.wait_for(lambda: (message.text or "").endswith("Done"), timeout=10)
    assert message.text == "bar 100%\nDone"  # no empty first line where the tail was
