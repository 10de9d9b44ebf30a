"""Voice notes as text, the pure parts: the transcript's cleaning, which notes are
transcribed, the transcript item and who gets its ``transcribedFrom``, what ``follow`` types, and the
settings (the key read from its file, never shown)."""

from __future__ import annotations

from pathlib import Path

import dataclasses

import pytest

from topicbus.core.records import FileRef, MediaItem, MessageItem, ReplyContext
from topicbus.follower.inputs import Received, transcript_text
from topicbus.follower.model import Delivery
from topicbus.follower.receiving import delivery_of
from topicbus.leader.inbound import adapt_for, transcript_item
from topicbus.leader.transcription import (TRANSCRIBE, Cause, TranscriptionOptions, _clean_transcript,
                                           verdict)
from topicbus.protocol import CAP_MEDIA, CAP_TRANSCRIPT, Deliver, FOLLOWER_BASE_CAPABILITIES, wire_item
from topicbus.settings import ConfigurationError, load_settings
from topicbus.speech.client import TranscriptionEndpoint

ENDPOINT = TranscriptionEndpoint(base_url="http://127.0.0.1:9000", key="sk-secret-key-0123")
ON = TranscriptionOptions(endpoint=ENDPOINT, max_s=300)


def voice(kind: str = "voice", duration: int | None = 5, size: int | None = 20_000, **fields) -> MediaItem:
    return MediaItem(files=(FileRef(file_id="f1", file_name="voice.ogg", mime_type="audio/ogg", file_size=size,
                                    kind=kind, duration=duration),),
                     caption=fields.get("caption"), message_id=812, from_user_id=1, from_name="Owner", date=1,
                     reply=fields.get("reply"))


# --- the cleaning -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "typed"), [
    ("hello world", "hello world"),
    ("  line one\nline two\r\nline three\rfour  ", "line one line two line three four"),
    ("tab\tand\u2028separator\u2029para\x85next", "tab and separator para next"),
    ("bell\x07 nul\x00 esc\x1b[2J del\x7f", "bell nul esc [2J del"),  # topicbus.metadata: a run is one space
    ("zero\u200bwidth bidi\u202eover", "zero width bidi over"),
    ("ünïcödé, emoji 🎙 and 漢字 stay", "ünïcödé, emoji 🎙 and 漢字 stay"),
    ("\n\n\x00\n", ""),
])
def test_a_transcript_becomes_one_line_without_control_characters(raw: str, typed: str):
    assert _clean_transcript(raw) == typed


# --- which notes are transcribed -------------------------------------------------------------------
def test_voice_notes_and_audio_within_the_limit_are_transcribed():
    assert verdict(voice(), ON) == TRANSCRIBE
    assert verdict(voice("audio", duration=300), ON) == TRANSCRIBE
    assert verdict(voice(duration=None), ON) == TRANSCRIBE  # no duration: the byte cap still holds


def test_notes_over_the_limit_or_without_an_endpoint_fall_back_and_others_are_not_voice_notes():
    assert verdict(voice(duration=301), ON) is Cause.TOO_LONG
    assert verdict(voice(duration=None, size=ON.max_bytes + 1), ON) is Cause.TOO_LONG
    assert verdict(voice(), TranscriptionOptions()) is Cause.OFF
    assert verdict(voice("video"), ON) is None
    assert verdict(MessageItem(text="hi"), ON) is None
    note = voice()
    too_large = dataclasses.replace(note, files=(dataclasses.replace(note.files[0], too_large=True),))
    assert verdict(too_large, ON) is None
    two = dataclasses.replace(note, files=note.files * 2)
    assert verdict(two, ON) is None


# --- the item, and who gets what --------------------------------------------------------------------
def test_the_transcript_is_a_message_that_names_its_file_only_to_followers_that_take_it():
    reply = ReplyContext(message_id=5, text="question", from_name="TopicBus", from_agent=True)
    item = transcript_item(voice(caption="see", reply=reply), "what was said")
    assert item.text == "what was said" and item.caption == "see"
    assert item.message_id == 812 and item.reply == reply and item.document is None
    assert item.transcribed_from is not None
    assert item.transcribed_from.file_id == "f1" and item.transcribed_from.kind == "voice"

    old = adapt_for(item, FOLLOWER_BASE_CAPABILITIES | {CAP_MEDIA})
    assert isinstance(old, MessageItem) and old.transcribed_from is None and old.text == "what was said"
    assert "transcribedFrom" not in wire_item(old)  # an older follower never sees the field
    new = adapt_for(item, FOLLOWER_BASE_CAPABILITIES | {CAP_MEDIA, CAP_TRANSCRIPT})
    assert new == item and wire_item(item)["transcribedFrom"]["fileId"] == "f1"
    assert "transcribedFrom" not in wire_item(MessageItem(text="plain"))


def test_follow_types_the_transcript_and_the_file_line_only_with_context():
    frame = Deliver.model_validate({"kind": "leader.deliver", "requestId": "d-7", "deliveryId": "d-7",
                                    "instanceId": "i", "registrationGeneration": "g",
                                    "item": wire_item(transcript_item(voice(caption="see this"), "what was said"))})
    delivery = delivery_of(frame)
    assert delivery.text == "what was said" and delivery.transcribed_from is not None
    assert transcript_text(delivery) == "what was said\nsee this"
    saved = Received("voice", "voice.ogg", path="/w/.topicbus/inbox/812-1-voice.ogg")
    assert transcript_text(delivery, saved, context=True) == (
        "what was said\n[voice /w/.topicbus/inbox/812-1-voice.ogg] see this")
    assert transcript_text(delivery, None, context=True) == "what was said\n[voice voice.ogg] see this"
    failed = Received("voice", "voice.ogg", problem="failed")
    assert transcript_text(delivery, failed, context=True) == "what was said\n[voice voice.ogg failed] see this"
    plain = Delivery(delivery_id="d-8", text="spoken", caption=None, message_id=1, from_user_id=1, from_name=None,
                     date=None, document=None, transcribed_from={"kind": "audio", "fileName": "a.mp3"})
    assert transcript_text(plain) == "spoken"


# --- settings ----------------------------------------------------------------------------------------
def test_the_key_is_read_from_its_file_and_counted_among_the_secrets(tmp_path: Path):
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-the-file-0123\n", encoding="utf-8")
    s = load_settings(None, transcribe_url="https://api.example.com/", transcribe_key_file=str(key_file))
    assert s.transcribe_url == "https://api.example.com"
    assert s.transcribe_key == "sk-from-the-file-0123" and "sk-from-the-file-0123" in s.secrets()
    assert (s.transcribe_model, s.transcribe_language, s.transcribe_max_s, s.transcribe_timeout_s) == (
        "whisper-1", None, 300, 60.0)
    assert "sk-from-the-file" not in repr(s)


def test_a_key_file_that_cannot_be_read_is_a_leader_problem_that_does_not_show_the_key(tmp_path: Path):
    missing = load_settings(None, transcribe_key_file=str(tmp_path / "nope"))
    assert [p for p in missing.leader_problems() if "TRANSCRIBE" in p] == [
        f"TOPICBUS_TRANSCRIBE_KEY_FILE: cannot read {tmp_path / 'nope'} (No such file or directory)"]
    two_lines = tmp_path / "two"
    two_lines.write_text("sk-one\nsk-two\n", encoding="utf-8")
    problems = [p for p in load_settings(None, transcribe_key_file=str(two_lines)).leader_problems()
                if "TRANSCRIBE" in p]
    assert problems == [f"TOPICBUS_TRANSCRIBE_KEY_FILE: {two_lines} must hold the key alone, on one line"]
    assert load_settings(None, transcribe_url="  ").transcribe_url is None


@pytest.mark.parametrize("url", ["ftp://host", "host:9000", "https://"])
def test_a_transcription_url_that_is_not_http_is_refused(url: str):
    with pytest.raises(ConfigurationError) as caught:
        load_settings(None, transcribe_url=url)
    assert caught.value.problems[0].startswith("TOPICBUS_TRANSCRIBE_URL: must be the base URL")


def test_the_endpoint_names_its_host_and_never_shows_its_key():
    endpoint = TranscriptionEndpoint(base_url="https://user:pw@stt.example.com:8443", key="sk-secret-key-0123")
    assert endpoint.host == "stt.example.com:8443"
    assert endpoint.url == "https://user:pw@stt.example.com:8443/v1/audio/transcriptions"
    assert "sk-secret" not in repr(endpoint) and "key=set" in repr(endpoint)
