"""Voice notes as text (docs/operations.md, "Voice notes as text") end to end: a real ``topicbus leader`` against the fake Bot API and
a fake OpenAI-compatible transcription endpoint (``tests/support/fake_transcriber.py``), with the real
``topicbus follow`` running a recording agent. The transcript reaches the agent's stdin as a message
the owner wrote, and the topic shows it as a reply to the voice note; a note that cannot be
transcribed reaches the agent as a file, and the topic says why once per cause."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import CHAT_ID, OWNER_ID, RECORDING_AGENT, Cluster, Proc, recorded_lines
from tests.support.fake_transcriber import FakeTranscriber

pytestmark = pytest.mark.e2e

DEADLINE_S = 30.0  # end-to-end waits on a loaded 2-core machine; a failure shows the processes' logs


def endpoint_env(cluster: Cluster, transcriber: FakeTranscriber, **extra: str) -> dict[str, str]:
    key_file = cluster.tmp / "transcribe.key"
    key_file.write_text(f"{transcriber.key}\n", encoding="utf-8")
    return {"TOPICBUS_TRANSCRIBE_URL": transcriber.base_url, "TOPICBUS_TRANSCRIBE_KEY_FILE": str(key_file),
            **extra}


async def recording_follower(cluster: Cluster, name: str, *, context: bool = False) -> tuple[int, Path]:
    """A ``topicbus follow`` of a recording agent in its own topic; (thread id, the agent's stdin log)."""
    work = cluster.tmp / name
    work.mkdir()
    out = cluster.tmp / f"{name}.stdin"
    await cluster.spawn(f"follow-{name}", ["follow", "--cwd", str(work), *(["--context"] if context else []),
                                           "--", sys.executable, "-u", "-c", RECORDING_AGENT], AGENT_OUT=str(out))
    thread = (await cluster.wait_follower_topic(work, DEADLINE_S))["threadId"]
    await cluster.wait_text(thread, "agent ready", DEADLINE_S)
    return thread, out


def voice(cluster: Cluster, thread: int, content: bytes, *, duration: int = 5, **kwargs: Any) -> int:
    update = cluster.fake.push_media(CHAT_ID, "voice", thread_id=thread, content=content, duration=duration,
                                     from_id=OWNER_ID, **kwargs)
    return update["message"]["message_id"]


def say(cluster: Cluster, thread: int, text: str) -> int:
    return cluster.fake.push_message(CHAT_ID, text, thread_id=thread, from_id=OWNER_ID)["message"]["message_id"]


async def stdin_lines(cluster: Cluster, out: Path, count: int) -> list[str]:
    await cluster.wait_for(lambda: len(recorded_lines(out)) >= count, DEADLINE_S,
                           lambda: f"{count} lines on the agent's stdin: {recorded_lines(out)}")
    return recorded_lines(out)


def echoes(cluster: Cluster, thread: int) -> list[tuple[str, Any]]:
    """The transcripts shown in a topic: (text, the message it replies to) of each ``🎙 …`` sent there."""
    return [(c.params.get("text"), (c.params.get("reply_parameters") or {}).get("message_id"))
            for c in cluster.fake.calls_to("sendMessage")
            if c.status == 200 and c.params.get("message_thread_id") == thread
            and str(c.params.get("text", "")).startswith("🎙 ") and "reached the agent" not in c.params["text"]
            and "reach this agent" not in c.params["text"]]


def voice_notes_metric(cluster: Cluster) -> dict[str, float]:
    """``topicbus_voice_notes_total`` by outcome, from ``/metrics``."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    prefix = 'topicbus_voice_notes_total{outcome="'
    return {line[len(prefix):].split('"')[0]: float(line.split()[-1]) for line in lines if line.startswith(prefix)}


def notices(cluster: Cluster, thread: int, needle: str) -> list[str]:
    return [t for t in cluster.texts_in(thread) if needle in t]


async def updates_confirmed(cluster: Cluster) -> None:
    """The leader confirmed every queued update (it journals a batch before confirming it)."""
    await cluster.wait_for(lambda: not cluster.fake.pending_updates(), DEADLINE_S, "updates confirmed")


async def test_a_voice_note_becomes_text_on_stdin_and_a_reply_in_the_topic_before_what_followed_it(
        cluster: Cluster, transcriber: FakeTranscriber):
    cluster.env_overrides.update(endpoint_env(cluster, transcriber, TOPICBUS_TRANSCRIBE_LANGUAGE="en"))
    leader = await cluster.start_leader()
    await cluster.wait_polling(DEADLINE_S)
    thread, out = await recording_follower(cluster, "voice")
    control = (await cluster.status())["controlThreadId"]

    # The transcription is held at the endpoint while the owner writes on: that text waits behind it.
    transcriber.hold_next()
    transcriber.answer("Deploy the\nbranch\x07 now\u200b\tplease\r\n\x1b[31m", "second note")
    first = voice(cluster, thread, b"OggS first voice note")
    say(cluster, thread, "right after the voice note")
    await cluster.wait_for(lambda: transcriber.held == 1, DEADLINE_S, "the endpoint asked")
    await updates_confirmed(cluster)
    assert recorded_lines(out) == []  # journaled, but held behind the voice note

    transcriber.release()
    assert (await stdin_lines(cluster, out, 2))[:2] == ["Deploy the branch now please [31m",
                                                        "right after the voice note"]
    await cluster.wait_for(lambda: echoes(cluster, thread), DEADLINE_S, "the transcript in the topic")
    assert echoes(cluster, thread) == [("🎙 Deploy the branch now please [31m", first)]

    # What the endpoint got: the file, the model, the language and the key.
    [request] = transcriber.requests
    assert (request.audio, request.model, request.language, request.authorization) == (
        b"OggS first voice note", "whisper-1", "en", f"Bearer {transcriber.key}")
    assert request.file_name == "voice.ogg" and request.content_type == "audio/ogg"
    assert transcriber.refused == []

    # A second note: transcribed too; the control topic named the endpoint once, before the first.
    second = voice(cluster, thread, b"OggS second voice note")
    assert (await stdin_lines(cluster, out, 3))[2] == "second note"
    await cluster.wait_for(lambda: len(echoes(cluster, thread)) == 2, DEADLINE_S, "the second transcript")
    assert echoes(cluster, thread)[1] == ("🎙 second note", second)
    told = await cluster.wait_for(lambda: notices(cluster, control, "Voice notes are transcribed by"), DEADLINE_S,
                                  "the control topic told where the audio goes")
    assert told == [f"🎙 Voice notes are transcribed by 127.0.0.1:{transcriber.port}: their audio leaves this "
                    "machine for that endpoint (TOPICBUS_TRANSCRIBE_URL)."]
    assert not any("[voice" in line for line in recorded_lines(out))  # no file line without --context

    # A failure whose answer repeats the key: the key still never reaches the leader's log.
    transcriber.fail_next(500)
    voice(cluster, thread, b"OggS third voice note")
    await cluster.wait_text(thread, "transcription failed (the endpoint answered HTTP 500)", DEADLINE_S)
    assert transcriber.key not in leader.log()
    assert "voice note" in leader.log()  # the log did record the transcriptions
    assert voice_notes_metric(cluster) == {"transcribed": 2.0, "file": 1.0}


async def test_with_context_the_file_line_follows_the_transcript(cluster: Cluster, transcriber: FakeTranscriber):
    cluster.env_overrides.update(endpoint_env(cluster, transcriber))
    await cluster.start_leader()
    await cluster.wait_polling(DEADLINE_S)
    thread, out = await recording_follower(cluster, "context", context=True)
    transcriber.answer("what the owner said")
    message_id = voice(cluster, thread, b"OggS voice", caption="see this")
    text, file_line = (await stdin_lines(cluster, out, 2))[:2]
    assert text == "what the owner said"
    assert file_line.startswith("[voice ") and file_line.endswith(f"{message_id}-1-voice.ogg] see this")
    saved = Path(file_line[len("[voice "):-len("] see this")])
    assert saved.read_bytes() == b"OggS voice"


async def test_a_failing_a_slow_and_a_too_long_note_fall_back_to_the_file_with_one_notice_each(
        cluster: Cluster, transcriber: FakeTranscriber):
    cluster.env_overrides.update(endpoint_env(cluster, transcriber, TOPICBUS_TRANSCRIBE_TIMEOUT_S="2",
                                              TOPICBUS_TRANSCRIBE_MAX_S="60"))
    leader: Proc = await cluster.start_leader()
    await cluster.wait_polling(DEADLINE_S)
    thread, out = await recording_follower(cluster, "fallback")

    transcriber.fail_next(500, times=2)
    for n in (1, 2):
        voice(cluster, thread, f"OggS failing {n}".encode())
    lines = await stdin_lines(cluster, out, 2)
    assert [line.startswith("[voice ") for line in lines] == [True, True]
    assert [Path(line[len("[voice "):-1]).read_bytes() for line in lines] == [b"OggS failing 1", b"OggS failing 2"]

    transcriber.hold_next(times=2)  # beyond the 2 s deadline: the test releases them only at its end
    for n in (3, 4):
        voice(cluster, thread, f"OggS slow {n}".encode())
    lines = await stdin_lines(cluster, out, 4)
    assert [Path(line[len("[voice "):-1]).read_bytes() for line in lines[2:]] == [b"OggS slow 3", b"OggS slow 4"]

    asked = len(transcriber.requests)
    for duration in (61, 600):  # longer than TOPICBUS_TRANSCRIBE_MAX_S: never sent to the endpoint
        voice(cluster, thread, b"OggS long", duration=duration)
    lines = await stdin_lines(cluster, out, 6)
    assert all(line.startswith("[voice ") for line in lines)
    assert len(transcriber.requests) == asked == 4

    say(cluster, thread, "done")
    await stdin_lines(cluster, out, 7)
    await cluster.wait_for(lambda: len(notices(cluster, thread, "🎙")) >= 3, DEADLINE_S, "three notices")
    assert notices(cluster, thread, "🎙") == [
        "🎙 A voice note reached the agent as a file: transcription failed (the endpoint answered HTTP 500).",
        "🎙 A voice note reached the agent as a file: no transcript within 2 s.",
        "🎙 A voice note longer than 1:00 reached the agent as a file: longer notes are not transcribed "
        "(TOPICBUS_TRANSCRIBE_MAX_S)."]
    assert echoes(cluster, thread) == []
    assert transcriber.key not in leader.log()
    assert voice_notes_metric(cluster) == {"transcribed": 0.0, "file": 4.0}


async def test_without_an_endpoint_voice_notes_stay_files_and_the_topic_says_why_once(cluster: Cluster):
    await cluster.start_leader()
    await cluster.wait_polling(DEADLINE_S)
    thread, out = await recording_follower(cluster, "off")
    for n in (1, 2):
        voice(cluster, thread, f"OggS {n}".encode())
    say(cluster, thread, "done")
    lines = await stdin_lines(cluster, out, 3)
    assert [Path(line[len("[voice "):-1]).read_bytes() for line in lines[:2]] == [b"OggS 1", b"OggS 2"]
    assert lines[2] == "done"
    await cluster.wait_text(thread, "no transcription endpoint", DEADLINE_S)
    assert notices(cluster, thread, "🎙") == [
        "🎙 Voice notes reach this agent as files: the leader has no transcription endpoint "
        "(TOPICBUS_TRANSCRIBE_URL)."]


async def test_a_note_held_when_the_leader_dies_is_transcribed_by_the_next_leader(
        cluster: Cluster, transcriber: FakeTranscriber):
    cluster.env_overrides.update(endpoint_env(cluster, transcriber))
    first = await cluster.start_leader()
    await cluster.wait_polling(DEADLINE_S)
    thread, out = await recording_follower(cluster, "restart")

    transcriber.hold_next()
    transcriber.answer("said before the crash")
    message_id = voice(cluster, thread, b"OggS before the crash")
    say(cluster, thread, "typed before the crash")
    await cluster.wait_for(lambda: transcriber.held == 1, DEADLINE_S, "the endpoint asked")
    await updates_confirmed(cluster)
    first.kill()  # SIGKILL while the transcription is in flight: the note is journaled, held
    await first.wait()

    await cluster.start_leader()
    assert (await stdin_lines(cluster, out, 2))[:2] == ["said before the crash", "typed before the crash"]
    await cluster.wait_for(lambda: echoes(cluster, thread), DEADLINE_S, "the transcript in the topic")
    assert echoes(cluster, thread) == [("🎙 said before the crash", message_id)]
    assert len(transcriber.requests) == 2  # asked again by the next leader
