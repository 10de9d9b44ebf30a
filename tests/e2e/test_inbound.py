"""The inbound side end to end (replies, edits, media, albums, reactions): a real ``topicbus leader`` process against the
fake Bot API, followers on the bus speaking the protocol with the new capabilities (``RawAgent``),
and the real ``topicbus follow`` for what an older follower gets. Replies, edits, voice, audio and
albums as files fetched from /v1/files, too-large files, receipt reactions, reserved commands and
controls that never reach a successor, /queue, /drop and the offline TTL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, SECRET, Cluster, RawBus, register_frame
from topicbus.leader.offline import OFFLINE_NOTICE
from topicbus.protocol import Capabilities, follower_identity, heartbeat_frame, receipt_frame, send_frame, text_message

pytestmark = pytest.mark.e2e


class RawAgent:
    """One follower on the bus, frame by frame: it registers with the capabilities given,
    heartbeats, keeps every frame the leader sends, and acknowledges deliveries when told to."""

    def __init__(self, cluster: Cluster, bus: RawBus):
        self.cluster = cluster
        self.bus = bus
        self.registration: dict[str, Any] = {}
        self.thread = 0
        self.frames: list[dict[str, Any]] = []
        self._tasks = [asyncio.create_task(self._read())]

    @classmethod
    async def join(cls, cluster: Cluster, cwd: Path, *types: str) -> RawAgent:
        agent = cls(cluster, await RawBus.connect(cluster))
        protocol = follower_identity("e2e-inbound", Capabilities.for_follower(["message", *types]))
        agent.registration = register_frame(str(cwd), protocol=protocol, hostId="e2e-host")
        await agent.bus.send(agent.registration)
        rid = agent.registration["requestId"]
        ack = await cluster.wait_for(lambda: next((f for f in agent.frames if f.get("requestId") == rid
                                                   and f.get("kind") == "bus.ack"), None), message="registration ack")
        assert ack["ok"] is True, ack
        agent.thread = ack["result"]["threadId"]
        agent._tasks.append(asyncio.create_task(agent._heartbeat()))
        return agent

    async def _read(self) -> None:
        while True:
            msg = await self.bus.ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                return
            self.frames.append(json.loads(msg.data))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            await self.bus.send(heartbeat_frame(f"hb-{uuid.uuid4().hex}", self.registration["instanceId"],
                                                self.registration["registrationGeneration"]))

    def deliveries(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("kind") == "leader.deliver"]

    def items(self) -> list[dict[str, Any]]:
        return [d["item"] for d in self.deliveries()]

    async def wait_items(self, count: int) -> list[dict[str, Any]]:
        await self.cluster.wait_for(lambda: len(self.items()) >= count,
                                    message=lambda: f"{count} deliveries, got {self.items()}")
        return self.items()

    async def ack_all(self) -> None:
        for d in self.deliveries():
            await self.bus.send(receipt_frame(d["deliveryId"]))

    async def say(self, text: str) -> None:
        await self.bus.send(send_frame(f"say-{uuid.uuid4().hex}", self.registration["instanceId"],
                                       self.registration["registrationGeneration"], text_message(text)))

    async def fetch(self, file_id: str) -> tuple[int, bytes]:
        async with self.bus.session.get(f"http://127.0.0.1:{self.cluster.port}/v1/files/{file_id}",
                                        headers={"Authorization": f"Bearer {SECRET}"}) as resp:
            return resp.status, await resp.read()

    async def leave(self) -> None:
        """The socket drops (no disconnect: the binding and topic stay, the agent is offline);
        returns once the leader knows it."""
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.bus.close()
        instance = self.registration["instanceId"]

        async def offline() -> bool:
            snap = await self.cluster.status()
            return bool(snap) and not any(f["instanceId"] == instance and f["online"] for f in snap["followers"])

        await self.cluster.wait_for(offline, message=f"the leader to see {instance} offline")


def push(cluster: Cluster, thread: int, text: str, **kwargs: Any) -> int:
    return cluster.fake.push_message(CHAT_ID, text, thread_id=thread, from_id=OWNER_ID, **kwargs)["message"]["message_id"]


async def leader(cluster: Cluster, **env: str) -> None:
    await cluster.start_leader(**env)
    await cluster.wait_polling()


async def test_replies_edits_voice_audio_albums_and_large_files_reach_the_agent(cluster: Cluster):
    await leader(cluster)
    agent = await RawAgent.join(cluster, cluster.tmp / "ctx", "media", "edit")
    thread = agent.thread
    try:
        await agent.say("build finished: 3 warnings")
        await cluster.wait_text(thread, "build finished")
        output = next(m for m in cluster.fake.messages_in(CHAT_ID, thread) if m.text == "build finished: 3 warnings")
        asked = push(cluster, thread, "why 3?", reply_to_message_id=output.message_id, quote="3 warnings")
        cluster.fake.push_edited_message(CHAT_ID, asked, "why 3 warnings?", thread_id=thread, from_id=OWNER_ID)
        cluster.fake.push_media(CHAT_ID, "voice", thread_id=thread, content=b"OggS voice", duration=5,
                                from_id=OWNER_ID)
        cluster.fake.push_media(CHAT_ID, "audio", thread_id=thread, content=b"ID3 song", duration=180,
                                caption="this one", from_id=OWNER_ID)
        cluster.fake.push_album(CHAT_ID, [("photo", b"jpeg 1"), ("photo", b"jpeg 2"), ("video", b"mp4 3")],
                                thread_id=thread, caption="from the trip")
        cluster.fake.push_media(CHAT_ID, "video", thread_id=thread, size=30 * 1024 * 1024, caption="the full demo",
                                from_id=OWNER_ID)
        reply, edit, voice, audio, album, big = await agent.wait_items(6)

        assert reply["reply"] == {"messageId": output.message_id, "text": "build finished: 3 warnings",
                                  "fromName": "TopicBus", "fromAgent": True, "quote": "3 warnings"}
        assert edit == {"type": "edit", "messageId": asked, "text": "why 3 warnings?"}
        assert [(f["kind"], f["duration"]) for f in voice["files"]] == [("voice", 5)]
        assert [(f["kind"], f["duration"]) for f in audio["files"]] == [("audio", 180)] and audio["caption"] == "this one"
        assert [f["kind"] for f in album["files"]] == ["photo", "photo", "video"] and album["caption"] == "from the trip"
        fetched = [await agent.fetch(f["fileId"]) for item in (voice, audio, album) for f in item["files"]]
        assert fetched == [(200, b"OggS voice"), (200, b"ID3 song"), (200, b"jpeg 1"), (200, b"jpeg 2"),
                           (200, b"mp4 3")]
        assert big["files"][0]["tooLarge"] is True and big["caption"] == "the full demo"
        await cluster.wait_text(thread, "Too large for the agent")
        assert (await agent.fetch(big["files"][0]["fileId"]))[0] == 404
        assert (await agent.fetch("never-routed-file"))[0] == 404

        # The receipt reaction: once per owner message the agent confirmed (an album: its first part).
        assert cluster.fake.reactions == []
        await agent.ack_all()
        await agent.ack_all()  # a repeated receipt changes nothing
        reacted = [reply["messageId"], voice["messageId"], audio["messageId"], album["messageId"], big["messageId"]]
        await cluster.wait_for(lambda: len(cluster.fake.reactions) >= len(reacted), message="receipt reactions")
        assert sorted((r.message_id, r.emoji) for r in cluster.fake.reactions) == sorted((m, "👀") for m in reacted)
    finally:
        await agent.leave()


async def test_reserved_commands_and_controls_that_never_reach_a_successor(cluster: Cluster):
    await leader(cluster)
    work = cluster.tmp / "ctl"
    first = await RawAgent.join(cluster, work, "control")
    thread = first.thread
    try:
        for text in ("sleep 100", "/interrupt", "/help", "/help@topicbus_test_bot", "//kill", "/kill"):
            push(cluster, thread, text)
        items = await first.wait_items(6)
        assert [(i["type"], i.get("text") or i.get("action")) for i in items] == [
            ("message", "sleep 100"), ("control", "interrupt"), ("message", "/help"), ("message", "/help"),
            ("message", "/kill"), ("control", "kill")]
    finally:
        await first.leave()  # it never confirmed anything: the messages wait for the next process

    push(cluster, thread, "/eof")  # offline: never kept for a later process
    await cluster.wait_text(thread, "/eof was not sent: this agent is offline")
    successor = await RawAgent.join(cluster, work, "control")
    try:
        push(cluster, thread, "hello successor")
        items = await successor.wait_items(5)
        assert [i.get("text") for i in items] == ["sleep 100", "/help", "/help", "/kill", "hello successor"]
        assert all(i["type"] == "message" for i in successor.items())
    finally:
        await successor.leave()

    old = await RawAgent.join(cluster, cluster.tmp / "old")  # a follower without control-v1
    try:
        push(cluster, old.thread, "/interrupt")
        await cluster.wait_text(old.thread, "does not take commands")
        assert old.items() == []
    finally:
        await old.leave()


async def test_help_reaches_a_follow_agent_verbatim(cluster: Cluster):
    _, _, thread = await cluster.leader_with_follower(cluster.tmp / "echo")
    push(cluster, thread, "/help@topicbus_test_bot")
    push(cluster, thread, "//queue")
    await cluster.wait_text(thread, "echo: /help")
    await cluster.wait_text(thread, "echo: /queue")
    push(cluster, thread, "/queue")  # reserved: answered by the leader, never seen by the agent
    answered = lambda: any("the agent is online" in t or "on the way to the agent" in t  # noqa: E731
                           for t in cluster.texts_in(thread))
    await cluster.wait_for(answered, message=lambda: f"the /queue answer in {cluster.texts_in(thread)}")
    assert not any(t == "echo: /queue" for t in cluster.texts_in(thread)[-1:])


async def test_queue_drop_and_offline_expiry_are_visible_in_the_topic(cluster: Cluster):
    await leader(cluster, TOPICBUS_OFFLINE_TTL_S="5")
    work = cluster.tmp / "away"
    agent = await RawAgent.join(cluster, work)
    thread = agent.thread
    await agent.leave()
    push(cluster, thread, "deploy to production")
    push(cluster, thread, "/queue")
    listing_seen = lambda: any("1 message waits" in t and "deploy to production" in t  # noqa: E731
                               for t in cluster.texts_in(thread))
    await cluster.wait_for(listing_seen, message=lambda: f"the /queue listing in {cluster.texts_in(thread)}")
    push(cluster, thread, "/drop")
    await cluster.wait_text(thread, "Dropped 1 message")

    push(cluster, thread, "rm -rf build")  # nobody comes for it within the TTL
    await cluster.wait_text(thread, "expired")
    expiry = next(t for t in cluster.texts_in(thread) if "expired" in t)
    assert "rm -rf build" in expiry and "1 message waited more than 5 s" in expiry

    back = await RawAgent.join(cluster, work)
    try:
        push(cluster, thread, "fresh")
        (first,) = await back.wait_items(1)
        assert first["text"] == "fresh"
    finally:
        await back.leave()


# A child that writes every line it is typed to typed.log (in its working directory) and says so.
RECORDER = """
import sys
print("agent ready", flush=True)
with open("typed.log", "a", encoding="utf-8") as out:
    for line in sys.stdin:
        out.write(line)
        out.flush()
        print("got " + line.strip(), flush=True)
"""


@pytest.mark.parametrize("context", [False, True], ids=["default", "context"])
async def test_follow_types_each_file_as_kind_and_path_and_replies_and_edits_only_with_context(
        cluster: Cluster, context: bool):
    import sys

    await leader(cluster)
    work = cluster.tmp / f"typed-{'context' if context else 'default'}"
    work.mkdir()
    await cluster.spawn(f"follow-{work.name}", ["follow", "--cwd", str(work), *(["--context"] if context else []),
                                                "--", sys.executable, "-u", "-c", RECORDER])
    thread = (await cluster.wait_follower_topic(work))["threadId"]
    await cluster.wait_text(thread, "agent ready")
    output = next(m for m in cluster.fake.messages_in(CHAT_ID, thread) if m.text and "agent ready" in m.text)

    asked = push(cluster, thread, "why?", reply_to_message_id=output.message_id)
    cluster.fake.push_edited_message(CHAT_ID, asked, "why 3?", thread_id=thread, from_id=OWNER_ID)
    cluster.fake.push_media(CHAT_ID, "voice", thread_id=thread, content=b"OggS voice", duration=5, from_id=OWNER_ID)
    cluster.fake.push_album(CHAT_ID, [("photo", b"jpeg 1"), ("video", b"mp4 2")], thread_id=thread,
                            caption="from the trip")
    push(cluster, thread, "last")
    typed = work / "typed.log"
    await cluster.wait_for(lambda: typed.exists() and "last\n" in typed.read_text(encoding="utf-8"),
                           message=lambda: f"the child typed 'last': {typed.read_text() if typed.exists() else ''}")

    lines = typed.read_text(encoding="utf-8").splitlines()
    voice, photo, video = (line for line in lines if line.startswith(("[voice ", "[photo ", "[video ")))
    expected = ["why?", voice, photo, video, "last"]
    if context:
        expected = ["[reply to the agent: agent ready]", "why?", "[edit] why 3?", voice, photo, video, "last"]
    assert lines == expected
    assert photo.endswith(" from the trip")  # the album's caption follows its first file
    saved = [Path(line.split(" ", 1)[1].removesuffix(" from the trip").rstrip("]")) for line in (voice, photo, video)]
    assert [p.read_bytes() for p in saved] == [b"OggS voice", b"jpeg 1", b"mp4 2"]
    assert all(p.parent == work / ".topicbus" / "inbox" for p in saved)
    if not context:  # the edit never reached the agent, and the topic says so
        await cluster.wait_text(thread, "does not take edits")


# --- no false "offline" after a leader restart --------------------------------------------------------

WINDOW_MS = "8000"  # the restarted leader's startup window (FOLLOWER_STALE_AFTER_MS)


def offline_notices(cluster: Cluster, thread: int) -> list[str]:
    return [t for t in cluster.texts_in(thread) if t == OFFLINE_NOTICE]


async def test_an_agent_that_reconnects_after_a_leader_restart_is_never_called_offline(cluster: Cluster):
    leader, follower, thread = await cluster.leader_with_follower(cluster.tmp / "shop")
    # The leader stops; the owner types while it is down; the agent's reconnect is late: follow is
    # stopped (SIGSTOP) until the new leader has taken the message, then goes on and reconnects.
    leader.kill(signal.SIGTERM)
    await leader.wait()
    os.kill(follower.pid, signal.SIGSTOP)
    try:
        cluster.fake.push_message(CHAT_ID, "status please", thread_id=thread, from_id=OWNER_ID)
        second = await cluster.start_leader(TOPICBUS_FOLLOWER_STALE_AFTER_MS=WINDOW_MS)
        await cluster.wait_for(lambda: not cluster.fake.pending_updates(), message="the message taken")
    finally:
        os.kill(follower.pid, signal.SIGCONT)
    await cluster.wait_text(thread, "echo: status please")
    assert offline_notices(cluster, thread) == [], cluster.texts_in(thread)
    await cluster.wait_for(lambda: "startup window over: 1 agent(s) had messages, 0 still absent" in second.log(),
                           message="the startup window over")
    assert offline_notices(cluster, thread) == [], cluster.texts_in(thread)


async def test_an_agent_still_absent_when_the_startup_window_ends_is_called_offline(cluster: Cluster):
    leader, follower, thread = await cluster.leader_with_follower(cluster.tmp / "shop")
    leader.kill(signal.SIGTERM)
    await leader.wait()
    os.killpg(follower.pid, signal.SIGKILL)  # the agent is gone for good
    await follower.wait()
    cluster.fake.push_message(CHAT_ID, "anyone there?", thread_id=thread, from_id=OWNER_ID)
    await cluster.start_leader(TOPICBUS_FOLLOWER_STALE_AFTER_MS="3000", TOPICBUS_THREAD_CLEANUP="false")
    await cluster.wait_for(lambda: offline_notices(cluster, thread), 30,
                           lambda: f"the offline notice: {cluster.texts_in(thread)}")
    assert len(offline_notices(cluster, thread)) == 1
