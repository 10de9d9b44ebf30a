"""The inbound side (replies, edits, media, albums, reactions) with the real PTB Application, the real handlers and the
real poller against the fake Bot API, over a real store: reply context, edits, media and albums,
too-large files, receipt reactions, reserved commands and generation-bound controls, the offline
queue (/queue, /drop) and its expiry."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from topicbus import handlers
from topicbus.bot.poller import UpdatePoller
from topicbus.core.records import MessageItem
from topicbus.leader.assembly import LeaderServices
from topicbus.leader.routing import EDITS_NOT_TAKEN
from topicbus.protocol import Capabilities, follower_identity
from tests.fakebotapi import DEFAULT_USER_ID
from tests.integration.jobqueue import JobQueueControl
from tests.integration.leader_env import CHAT, Hold, LeaderEnv

WAIT = 10.0  # condition deadlines: long-poll 0.5 s, album window 1 s, outbox rescans, a busy box


async def fetched(services: LeaderServices, file_id: str) -> bytes | None:
    """A routed file's bytes as /v1/files streams them; None when it is not served."""
    async with services.router.open_document(file_id) as stream:
        return None if stream is None else b"".join([chunk async for chunk in stream.chunks()])


def caps(*types: str) -> dict[str, Any]:
    return follower_identity("test", Capabilities.for_follower(["message", *types]))


class Polled:
    """The leader term of ``env`` with its handlers registered and its own poller running, as in
    ``topicbus leader`` (only the bus socket is left out)."""

    def __init__(self, env: LeaderEnv):
        self.env = env
        self.poller: UpdatePoller | None = None

    @property
    def services(self) -> LeaderServices:
        assert self.env.services is not None
        return self.env.services

    async def start(self) -> LeaderServices:
        await self.env.start()
        self._poll()
        return self.services

    async def restart(self) -> LeaderServices:
        await self.stop()
        await self.env.restart()
        self._poll()
        return self.services

    def _poll(self) -> None:
        assert self.env.app is not None
        handlers.register_all(self.env.app, self.services, chat_id=CHAT, owner_ids=frozenset({DEFAULT_USER_ID}))
        self.poller = UpdatePoller(self.env.app, timeout_s=0.5, batch=self.services.batches.open)
        self.poller.start()

    async def stop(self) -> None:
        if self.poller is not None:
            await self.poller.stop()
            self.poller = None

    async def confirmed(self) -> None:
        """Every update pushed so far was fetched, handled, journaled and confirmed."""
        await self.env.fake.wait_for(lambda: not self.env.fake.pending_updates(), WAIT, "updates confirmed")

    def items(self, instance: str) -> list[dict[str, Any]]:
        return [d["item"] for d in self.env.connections[instance].deliveries()]

    async def wait_items(self, instance: str, count: int) -> list[dict[str, Any]]:
        await self.env.fake.wait_for(lambda: len(self.items(instance)) >= count, WAIT,
                                     f"{count} deliveries to {instance}: {self.items(instance)}")
        return self.items(instance)

    def texts_in(self, thread: int) -> list[str]:
        return [m.text or "" for m in self.env.fake.messages_in(CHAT, thread)]

    async def wait_notice(self, thread: int, needle: str) -> str:
        found = await self.env.fake.wait_for(
            lambda: next((t for t in self.texts_in(thread) if needle in t), None), WAIT,
            f"a notice with {needle!r} in thread {thread}")
        return found

    async def ack_all(self, instance: str) -> None:
        conn = self.env.connections[instance]
        for d in conn.deliveries():
            await self.services.followers.receipt(conn, d["deliveryId"])
        await self.services.delivery.flush()

    def go_offline(self, instance: str) -> None:
        """The follower's socket dropped and it was pruned: its binding and topic remain."""
        self.services.followers.connection_closed(self.env.connections[instance])
        self.services.roster.drop(instance)

    async def statuses(self) -> list[str]:
        assert self.env.db is not None
        return [r["status"] for r in await self.env.db.fetch_all("SELECT status FROM inbound_journal ORDER BY seq")]


@pytest.fixture
async def polled(env: LeaderEnv) -> AsyncIterator[Polled]:
    leader = Polled(env)
    try:
        yield leader
    finally:
        await leader.stop()


def message_id(update: dict[str, Any]) -> int:
    return update["message"]["message_id"]


# --- reply context and edits -------------------------------------------------------------------------


async def test_a_reply_carries_the_replied_to_message_who_wrote_it_and_the_quote(env: LeaderEnv, polled: Polled):
    await polled.start()
    thread = (await env.register("a", cwd="/w"))["threadId"]
    assert env.bot is not None
    agent_output = await env.bot.send_message(CHAT, "build finished: 3 warnings", message_thread_id=thread)
    env.fake.push_message(CHAT, "plain", thread_id=thread)
    env.fake.push_message(CHAT, "why 3?", thread_id=thread, reply_to_message_id=agent_output.message_id,
                          quote="3 warnings")
    own = env.fake.push_message(CHAT, "fix the tests", thread_id=thread)
    env.fake.push_message(CHAT, "and this too", thread_id=thread, reply_to_message_id=message_id(own))
    plain, why, _, also = await polled.wait_items("a", 4)
    assert plain["reply"] is None  # a topic message "replies" to the topic's creation: not a reply
    assert why["text"] == "why 3?" and why["reply"] == {
        "messageId": agent_output.message_id, "text": "build finished: 3 warnings", "fromName": "TopicBus",
        "fromAgent": True, "quote": "3 warnings"}
    assert also["reply"] == {"messageId": message_id(own), "text": "fix the tests", "fromName": "Owner",
                             "fromAgent": False, "quote": None}


async def test_an_edit_reaches_an_edit_follower_as_an_edit(env: LeaderEnv, polled: Polled):
    await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("edit")))["threadId"]
    sent = env.fake.push_message(CHAT, "helo wrld", thread_id=thread)
    env.fake.push_edited_message(CHAT, message_id(sent), "hello world", thread_id=thread)
    first, edit = await polled.wait_items("a", 2)
    assert first["type"] == "message" and first["text"] == "helo wrld"
    assert edit == {"type": "edit", "messageId": message_id(sent), "text": "hello world"}


async def test_a_follower_without_edit_v1_never_gets_an_edit_and_the_topic_is_told_once(env: LeaderEnv,
                                                                                         polled: Polled):
    services = await polled.start()
    thread = (await env.register("b", cwd="/v"))["threadId"]
    sent = env.fake.push_message(CHAT, "draft", thread_id=thread)
    env.fake.push_edited_message(CHAT, message_id(sent), "draft 2", thread_id=thread)
    env.fake.push_edited_message(CHAT, message_id(sent), "draft 3", thread_id=thread)
    await polled.confirmed()
    await env.fake.wait_for(lambda: polled.items("b"), WAIT, "the message")
    assert [i["type"] for i in polled.items("b")] == ["message"]
    assert await polled.statuses() == ["pending", "skipped", "skipped"]
    notices = [json.loads(r["payload"])["text"]
               for r in await env.db.fetch_all("SELECT payload FROM outbox WHERE kind = 'notice'")]
    assert notices.count(EDITS_NOT_TAKEN) == 1
    await polled.wait_notice(thread, "does not take edits")
    assert services.router.stats["routed"] == 3


async def test_an_edit_into_a_reserved_command_runs_nothing_and_is_not_delivered(env: LeaderEnv, polled: Polled):
    await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("edit", "control")))["threadId"]
    sent = env.fake.push_message(CHAT, "ls", thread_id=thread)
    env.fake.push_edited_message(CHAT, message_id(sent), "/kill", thread_id=thread)
    env.fake.push_message(CHAT, "after", thread_id=thread)
    items = await polled.wait_items("a", 2)
    assert [(i["type"], i.get("text")) for i in items] == [("message", "ls"), ("message", "after")]


# --- media ---------------------------------------------------------------------------------------------

MEDIA = [("voice", 7), ("audio", 200), ("video", 12), ("video_note", 9), ("animation", 4), ("photo", None),
         ("document", None)]


async def test_every_media_kind_reaches_a_media_follower_as_a_file_with_its_kind_and_duration(
        env: LeaderEnv, polled: Polled):
    services = await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("media")))["threadId"]
    for kind, duration in MEDIA:
        env.fake.push_media(CHAT, kind, thread_id=thread, content=f"<{kind} bytes>".encode(), duration=duration or 1,
                            caption=f"a {kind}")
    items = await polled.wait_items("a", len(MEDIA))
    for (kind, duration), item in zip(MEDIA, items, strict=True):
        assert item["type"] == "media" and item["caption"] == f"a {kind}"
        (file,) = item["files"]
        assert file["kind"] == kind and file["duration"] == duration and file["tooLarge"] is False
        assert file["fileSize"] == len(f"<{kind} bytes>")
        assert await fetched(services, file["fileId"]) == f"<{kind} bytes>".encode()


async def test_a_follower_without_media_v1_gets_each_file_as_a_document_as_before(env: LeaderEnv, polled: Polled):
    services = await polled.start()
    thread = (await env.register("b", cwd="/v"))["threadId"]
    env.fake.push_media(CHAT, "voice", thread_id=thread, content=b"ogg", caption="listen")
    env.fake.push_media(CHAT, "document", thread_id=thread, content=b"%PDF", file_name="spec.pdf",
                        mime_type="application/pdf")
    voice, pdf = await polled.wait_items("b", 2)
    assert voice["type"] == "message" and voice["caption"] == "listen" and voice["text"] is None
    assert voice["document"]["fileName"] == "voice.ogg" and voice["document"]["mimeType"] == "audio/ogg"
    assert pdf["document"] == {"fileId": pdf["document"]["fileId"], "fileName": "spec.pdf",
                               "mimeType": "application/pdf", "fileSize": 4}
    assert await fetched(services, voice["document"]["fileId"]) == b"ogg"


async def test_a_file_over_20_mb_gets_a_notice_and_the_agent_is_told_it_was_too_large(env: LeaderEnv,
                                                                                     polled: Polled):
    services = await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("media")))["threadId"]
    env.fake.push_media(CHAT, "video", thread_id=thread, size=25 * 1024 * 1024, caption="the demo")
    (item,) = await polled.wait_items("a", 1)
    (file,) = item["files"]
    assert file["tooLarge"] is True and file["fileSize"] == 25 * 1024 * 1024 and item["caption"] == "the demo"
    notice = await polled.wait_notice(thread, "Too large for the agent")
    assert "video" in notice and "25.0 MB" in notice and "20 MB" in notice
    assert await fetched(services, file["fileId"]) is None  # Telegram: "file is too big"


async def test_an_album_is_one_item_with_every_file_and_what_follows_waits_for_it(env: LeaderEnv, polled: Polled):
    services = await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("media")))["threadId"]
    jobs = JobQueueControl(env.app.job_queue if env.app else None)
    jobs.hold()  # the album's window does not end until the test says so
    env.fake.push_album(CHAT, [("photo", b"p1"), ("photo", b"p2"), ("video", b"v3")], thread_id=thread,
                        caption="the trip")
    env.fake.push_message(CHAT, "what do you see?", thread_id=thread)
    await polled.confirmed()
    assert await polled.statuses() == ["gathering", "gathering", "gathering", "pending"]
    assert polled.items("a") == []  # the question does not overtake the album
    await jobs.fast_forward()
    album, question = await polled.wait_items("a", 2)
    assert album["type"] == "media" and album["caption"] == "the trip"
    assert [f["kind"] for f in album["files"]] == ["photo", "photo", "video"]
    assert [await fetched(services, f["fileId"]) for f in album["files"]] == [b"p1", b"p2", b"v3"]
    assert question["text"] == "what do you see?"
    assert await polled.statuses() == ["pending", "merged", "merged", "pending"]
    await polled.ack_all("a")
    assert await polled.statuses() == ["delivered", "merged", "merged", "delivered"]


async def test_an_album_interrupted_by_a_leader_crash_is_delivered_once_with_its_late_parts(
        env: LeaderEnv, polled: Polled):
    await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("media")))["threadId"]
    JobQueueControl(env.app.job_queue if env.app else None).hold()  # this term never seals it
    env.fake.push_media(CHAT, "photo", thread_id=thread, content=b"p1", media_group_id="g1", caption="two+one")
    env.fake.push_media(CHAT, "photo", thread_id=thread, content=b"p2", media_group_id="g1")
    await polled.confirmed()
    assert await polled.statuses() == ["gathering", "gathering"]

    await polled.restart()  # a successor term on the same store
    env.connections.pop("a")  # the old term closed that socket; the follower comes back on a new one
    env.fake.push_media(CHAT, "photo", thread_id=thread, content=b"p3", media_group_id="g1")
    await env.register("a", cwd="/w", generation="g2", protocol=caps("media"))
    (album,) = await polled.wait_items("a", 1)
    assert len(album["files"]) == 3 and album["caption"] == "two+one"
    await polled.ack_all("a")
    assert await polled.statuses() == ["delivered", "merged", "merged"]


# --- receipt reactions ---------------------------------------------------------------------------------


async def test_the_receipt_reaction_appears_once_per_delivered_message(env: LeaderEnv, polled: Polled):
    services = await polled.start()
    thread = (await env.register("a", cwd="/w"))["threadId"]
    one = env.fake.push_message(CHAT, "one", thread_id=thread)
    two = env.fake.push_message(CHAT, "two", thread_id=thread)
    await polled.wait_items("a", 2)
    assert env.fake.reactions == []  # nothing before the agent's receipt
    await polled.ack_all("a")
    await env.fake.wait_for(lambda: len(env.fake.reactions) == 2, WAIT, "two reactions")
    assert env.fake.reactions_on(CHAT, message_id(one)) == ["👀"]
    assert env.fake.reactions_on(CHAT, message_id(two)) == ["👀"]

    three = env.fake.push_message(CHAT, "three", thread_id=thread)
    await polled.wait_items("a", 3)
    await env.register("a", cwd="/w", generation="g2")  # reconnect before the receipt: sent again
    await polled.wait_items("a", 4)
    await polled.ack_all("a")  # receipts for everything, twice for "three"
    await env.fake.wait_for(lambda: len(env.fake.reactions) == 3, WAIT, "the third reaction")
    assert services.reactions.requested == 3
    assert env.fake.reactions_on(CHAT, message_id(three)) == ["👀"]


async def test_receipt_reactions_can_be_switched_off(env: LeaderEnv, polled: Polled):
    env.receipt_reaction = "off"
    services = await polled.start()
    thread = (await env.register("a", cwd="/w"))["threadId"]
    env.fake.push_message(CHAT, "quiet please", thread_id=thread)
    await polled.wait_items("a", 1)
    await polled.ack_all("a")
    assert await polled.statuses() == ["delivered"]
    assert services.reactions.requested == 0 and env.fake.calls_to("setMessageReaction") == []


# --- reserved commands -------------------------------------------------------------------------------


async def test_only_reserved_commands_are_intercepted_and_everything_else_reaches_the_agent(
        env: LeaderEnv, polled: Polled):
    await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("control")))["threadId"]
    for text in ("make", "/interrupt", "/help@topicbus_test_bot", "//kill", "/kill@some_other_bot", "/help",
                 "/eof@topicbus_test_bot", "/status"):
        env.fake.push_message(CHAT, text, thread_id=thread)
    items = await polled.wait_items("a", 8)
    assert [(i["type"], i.get("text") or i.get("action")) for i in items] == [
        ("message", "make"), ("control", "interrupt"), ("message", "/help"), ("message", "/kill"),
        ("message", "/kill@some_other_bot"), ("message", "/help"), ("control", "eof"), ("message", "/status")]
    assert await polled.statuses() == ["pending"] * 6  # controls are never journaled
    frames = env.connections["a"].deliveries()
    assert all(f["deliveryId"].startswith("c-") for f in frames if f["item"]["type"] == "control")


async def test_a_control_is_not_sent_to_an_agent_that_is_offline_or_does_not_take_it(env: LeaderEnv,
                                                                                    polled: Polled):
    await polled.start()
    old = (await env.register("old", cwd="/old"))["threadId"]
    env.fake.push_message(CHAT, "/kill", thread_id=old)
    await polled.wait_notice(old, "does not take commands")
    gone = (await env.register("gone", cwd="/gone", protocol=caps("control")))["threadId"]
    polled.go_offline("gone")
    env.fake.push_message(CHAT, "/interrupt", thread_id=gone)
    await polled.wait_notice(gone, "this agent is offline")
    assert polled.items("old") == [] and polled.items("gone") == []
    assert await polled.statuses() == []


async def test_a_control_never_reaches_a_successor(env: LeaderEnv, polled: Polled):
    services = await polled.start()
    registered = await env.register("first", cwd="/w", protocol=caps("control"))
    thread, key = registered["threadId"], registered["bindingKey"]
    env.fake.push_message(CHAT, "/kill", thread_id=thread)
    (kill,) = await polled.wait_items("first", 1)
    assert kill == {"type": "control", "action": "kill", "messageId": kill["messageId"]}

    typed_at = env.clock.now
    env.clock.advance(5_000)
    await env.register("second", cwd="/w", generation="g2", protocol=caps("control"))  # supersedes "first"
    # The same /kill seen again (a leader that crashed before confirming it fetches it again): it
    # was typed before this process registered, so it is not for this one.
    outcome = await services.agent_commands.send_control(key, "kill", typed_at_ms=typed_at, origin="u-again")
    assert not outcome.sent and outcome.reason == "earlier-process"
    stale = await services.agent_commands.send_control(key, "kill", typed_at_ms=env.clock.now - 120_000)
    assert not stale.sent and stale.reason == "expired"
    env.fake.push_message(CHAT, "hello successor", thread_id=thread)
    (hello,) = await polled.wait_items("second", 1)
    assert hello["text"] == "hello successor"
    assert [i["type"] for i in polled.items("second")] == ["message"]
    await polled.wait_notice(thread, "meant for an earlier process")
    # A button press (the lead's callback) uses the same path: a button on the output of the
    # earlier process does nothing; one of the live generation reaches it.
    stale_button = await services.agent_commands.send_control(key, "interrupt", message_id=76, generation="g1",
                                                              notify=False)
    assert not stale_button.sent and stale_button.reason == "earlier-process" and stale_button.text
    pressed = await services.agent_commands.send_control(key, "interrupt", message_id=77, generation="g2",
                                                         notify=False)
    assert pressed.sent and polled.items("second")[-1] == {"type": "control", "action": "interrupt", "messageId": 77}
    assert [i["type"] for i in polled.items("second")] == ["message", "control"]


async def test_a_control_command_waiting_for_telegram_holds_up_no_other_update(env: LeaderEnv, polled: Polled):
    services = await polled.start()
    await env.register("a", cwd="/w")
    control = services.control.thread_id
    assert control is not None
    title_edit = Hold(env.fake, "editForumTopic")  # /mode's title edit is answered when the test says so
    env.fake.push_message(CHAT, "/mode names", thread_id=control)
    await title_edit.entered.wait()
    # While /mode waits for Telegram, the poller goes on: the next update is handled, journaled and
    # delivered, and polling is confirmed past both.
    thread = (await env.binding("/w")).thread_id
    env.fake.push_message(CHAT, "meanwhile", thread_id=thread)
    (meanwhile,) = await polled.wait_items("a", 1)
    assert meanwhile["text"] == "meanwhile"
    await polled.confirmed()
    assert not any("Display mode is now" in t for t in polled.texts_in(control))
    title_edit.release.set()
    await polled.wait_notice(control, "Display mode is now names (1 titles changed)")


# --- the offline queue ---------------------------------------------------------------------------------


async def test_queue_lists_what_waits_and_drop_clears_it(env: LeaderEnv, polled: Polled):
    await polled.start()
    thread = (await env.register("a", cwd="/w"))["threadId"]
    polled.go_offline("a")
    env.fake.push_message(CHAT, "run the migration", thread_id=thread)
    env.fake.push_media(CHAT, "voice", thread_id=thread, content=b"ogg", duration=65)
    env.fake.push_message(CHAT, "/queue", thread_id=thread)
    listing = await polled.wait_notice(thread, "wait for this agent")
    assert "2 messages wait" in listing and "run the migration" in listing and "voice message 1:05" in listing
    env.fake.push_message(CHAT, "/drop@topicbus_test_bot", thread_id=thread)
    await polled.wait_notice(thread, "Dropped 2 messages")
    assert await polled.statuses() == ["dropped", "dropped"]
    env.fake.push_message(CHAT, "/queue", thread_id=thread)
    await polled.wait_notice(thread, "Nothing waits for this agent.")

    await env.register("a", cwd="/w", generation="g2")
    env.fake.push_message(CHAT, "fresh", thread_id=thread)
    (first,) = await polled.wait_items("a", 1)
    assert first["text"] == "fresh"


async def test_messages_older_than_the_offline_ttl_expire_and_the_topic_says_so(env: LeaderEnv, polled: Polled):
    env.offline_ttl_s = 60
    services = await polled.start()
    thread = (await env.register("a", cwd="/w"))["threadId"]
    polled.go_offline("a")
    env.fake.push_message(CHAT, "rm -rf build", thread_id=thread)
    await polled.confirmed()
    env.clock.advance(61_000)

    # The agent registers before any sweep ran: the stale command is still never sent to it.
    await env.register("a", cwd="/w", generation="g2")
    notice = await polled.wait_notice(thread, "expired")
    assert "1 message waited more than 1 min" in notice and "rm -rf build" in notice
    env.fake.push_message(CHAT, "fresh", thread_id=thread)
    (first,) = await polled.wait_items("a", 1)
    assert first["text"] == "fresh"
    await polled.ack_all("a")

    polled.go_offline("a")  # and the sweep expires what nobody came for
    env.fake.push_message(CHAT, "forgotten", thread_id=thread)
    await polled.confirmed()
    env.clock.advance(61_000)
    assert await services.agent_commands.queue.sweep() == 1
    await polled.wait_notice(thread, "forgotten")
    assert (await polled.statuses()).count("expired") == 2



async def test_a_reserved_command_flushes_the_batch_before_it_and_a_failed_flush_loses_nothing(env: LeaderEnv):
    from topicbus.storage.db import StorageUnavailable

    services = await env.start()
    r = await env.register("a", cwd="/w", protocol=caps("control"))
    router, journal = services.router, services.router.journal
    real_append = journal.append_many

    async def unavailable_once(*args: Any, **kwargs: Any) -> Any:
        journal.append_many = real_append  # type: ignore[method-assign]
        raise StorageUnavailable("database is locked")

    text = MessageItem(text="before", message_id=1)
    async with services.batches.open() as batch:
        await router.route_owner_message(1, CHAT, r["threadId"], text, batch=batch)
        journal.append_many = unavailable_once  # type: ignore[method-assign]
        with pytest.raises(StorageUnavailable):
            await services.agent_commands.handle(CHAT, r["threadId"], "interrupt", update_id=2, batch=batch)
        # The poller retries the command's update: this time the flush journals "before" first.
        await services.agent_commands.handle(CHAT, r["threadId"], "interrupt", update_id=2, batch=batch)
    items = [d["item"] for d in env.connections["a"].deliveries()]
    assert [(i["type"], i.get("text") or i.get("action")) for i in items] == [("message", "before"),
                                                                             ("control", "interrupt")]
    assert await journal.count_pending() == {r["bindingKey"]: 1}
