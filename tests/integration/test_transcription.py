"""Voice notes as text (docs/operations.md, "Voice notes as text") in one leader term: the real PTB Application, handlers and poller
against the fake Bot API, a real store, and the fake transcription endpoint. What followers with and
without ``transcript-v1`` get, the file of a transcript fetched like any routed file, and a held note
that ``/drop`` drops while it is transcribed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fakebotapi import DEFAULT_USER_ID
from tests.integration.leader_env import CHAT, LeaderEnv
from tests.integration.test_inbound import WAIT, Polled, fetched
from tests.support.fake_transcriber import FakeTranscriber, transcriber  # noqa: F401 - the fixture
from topicbus.leader.transcription import TranscriptionOptions
from topicbus.protocol import CAP_TRANSCRIPT, Capabilities, follower_identity
from topicbus.speech.client import TranscriptionEndpoint


def caps(*names: str) -> dict[str, Any]:
    base = Capabilities.for_follower(["message", "media"])
    return follower_identity("test", Capabilities(base.names | set(names)))


@pytest.fixture
async def polled(env: LeaderEnv, transcriber: FakeTranscriber) -> AsyncIterator[Polled]:  # noqa: F811
    env.transcription = TranscriptionOptions(endpoint=TranscriptionEndpoint(base_url=transcriber.base_url,
                                                                            key=transcriber.key))
    leader = Polled(env)
    try:
        yield leader
    finally:
        await leader.stop()


def voice(env: LeaderEnv, thread: int, content: bytes) -> int:
    update = env.fake.push_media(CHAT, "voice", thread_id=thread, content=content, duration=4, caption="fyi")
    return update["message"]["message_id"]


async def test_a_follower_without_transcript_v1_gets_the_transcript_as_a_plain_message(
        env: LeaderEnv, polled: Polled, transcriber: FakeTranscriber):  # noqa: F811
    services = await polled.start()
    old = (await env.register("old", cwd="/old", protocol=caps()))["threadId"]
    new = (await env.register("new", cwd="/new", protocol=caps(CAP_TRANSCRIPT)))["threadId"]
    transcriber.answer("for the old one", "for the new one")
    old_note = voice(env, old, b"OggS old")
    [plain] = await polled.wait_items("old", 1)
    new_note = voice(env, new, b"OggS new")
    [rich] = await polled.wait_items("new", 1)

    assert plain["type"] == "message" and plain["text"] == "for the old one" and plain["caption"] == "fyi"
    assert plain["messageId"] == old_note and "transcribedFrom" not in plain and plain["document"] is None
    assert rich["type"] == "message" and rich["text"] == "for the new one" and rich["messageId"] == new_note
    assert (rich["transcribedFrom"]["kind"], rich["transcribedFrom"]["duration"]) == ("voice", 4)
    # The file a transcript was made from is routed: a follower fetches it as any other.
    assert await fetched(services, rich["transcribedFrom"]["fileId"]) == b"OggS new"


async def test_drop_while_a_note_is_transcribed_drops_it_and_nothing_is_echoed(
        env: LeaderEnv, polled: Polled, transcriber: FakeTranscriber):  # noqa: F811
    services = await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps(CAP_TRANSCRIPT)))["threadId"]
    polled.go_offline("a")
    transcriber.hold_next()
    voice(env, thread, b"OggS dropped")
    await env.fake.wait_for(lambda: transcriber.held == 1, WAIT, "the endpoint asked")
    env.fake.push_message(CHAT, "/drop", thread_id=thread, from_id=DEFAULT_USER_ID)
    await polled.wait_notice(thread, "Dropped")
    assert await polled.statuses() == ["dropped"]

    transcriber.release()
    await env.fake.wait_for(lambda: services.transcriber.in_flight == 0, WAIT, "the transcription ended")
    assert await polled.statuses() == ["dropped"]
    assert not [t for t in polled.texts_in(thread) if t.startswith("🎙")]
    assert services.transcriber.stats == {"transcribed": 0, "fell_back": 0}
