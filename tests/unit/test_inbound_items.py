"""Pure parts of the inbound side: what an owner message becomes, what each follower is given,
reserved-command parsing, album folding, the owner-facing words, the reaction decision."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from telegram import Message


from topicbus.core import records
from topicbus.core.records import (ControlItem, DocumentRef, EditItem, FileRef, MediaItem, MessageItem, ReplyContext,
                                   UnknownItem)
from topicbus.handlers.topic_messages import edit_payload, message_payload, owner_text
from topicbus.leader.agent_commands import expiry_interval_s, parse_reserved
from topicbus.leader.inbound import BOT_DOWNLOAD_LIMIT, adapt_for, age_text, combine_album, preview, too_large_notice
from topicbus.leader.reactions import reacted_messages, reaction_emoji
from topicbus.protocol import Capabilities, Deliver, decode_leader_frame, encode, leader_frame
from topicbus.core.journal import JournalItem

BOT_ID, BOT_NAME, THREAD = 999, "topicbus_bot", 5
OWNER = {"id": 1, "is_bot": False, "first_name": "Ada", "last_name": "L"}
CHAT = {"id": -100123, "type": "supergroup", "title": "Forum", "is_forum": True}


@pytest.fixture(autouse=True)
def leader_durations(monkeypatch: pytest.MonkeyPatch) -> None:
    """PTB hands durations as `topicbus leader` makes it (PTB_TIMEDELTA, cli.cmd_leader)."""
    monkeypatch.setenv("PTB_TIMEDELTA", "true")


def message(**fields: Any) -> Message:
    raw = {"message_id": 40, "date": 1_700_000_000, "chat": CHAT, "from": OWNER, "message_thread_id": THREAD,
           "is_topic_message": True, **fields}
    return Message.de_json(raw, None)


def topic_created() -> dict[str, Any]:
    return {"message_id": THREAD, "date": 1, "chat": CHAT, "from": OWNER,
            "forum_topic_created": {"name": "B", "icon_color": 7322096}}


# --- text ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("/help", "/help"), ("/help@topicbus_bot", "/help"), ("/help@TopicBus_Bot please", "/help please"),
    ("/help@other_bot", "/help@other_bot"), ("//kill", "/kill"), ("//", "/"), ("hello /x@topicbus_bot", "hello /x@topicbus_bot"),
    ("plain", "plain"),
])
def test_owner_text_strips_only_this_bots_name_and_one_escape_slash(text: str, expected: str):
    assert owner_text(text, BOT_NAME) == expected


@pytest.mark.parametrize("text, expected", [
    ("/interrupt", "interrupt"), ("/kill now", "kill"), ("/EOF", "eof"), ("/queue@topicbus_bot", "queue"),
    ("/drop@TOPICBUS_BOT", "drop"), ("/kill@other_bot", None), ("//kill", None), ("/killall", None),
    ("/help", None), ("kill", None), (" /kill", None), ("/kill\nrm", "kill"),
])
def test_only_the_five_reserved_commands_are_recognised(text: str, expected: str | None):
    assert parse_reserved(text, BOT_NAME) == expected


# --- payloads -------------------------------------------------------------------------------------------


def test_a_plain_topic_message_is_a_message_without_reply_context():
    item = message_payload(message(text="hi", reply_to_message=topic_created()), bot_id=BOT_ID, bot_username=BOT_NAME)
    assert item == MessageItem(text="hi", message_id=40, from_user_id=1, from_name="Ada L", date=1_700_000_000)


def test_a_reply_names_the_replied_message_its_author_and_the_quote():
    agent_output = {"message_id": 30, "date": 1, "chat": CHAT, "message_thread_id": THREAD,
                    "from": {"id": BOT_ID, "is_bot": True, "first_name": "TopicBus"}, "text": "3 tests failed"}
    item = message_payload(message(text="which?", reply_to_message=agent_output,
                                   quote={"text": "tests failed", "position": 2}), bot_id=BOT_ID)
    assert item is not None and item.reply == ReplyContext(message_id=30, text="3 tests failed", from_name="TopicBus",
                                                           from_agent=True, quote="tests failed")
    photo_reply = {"message_id": 31, "date": 1, "chat": CHAT, "from": OWNER, "caption": "this chart",
                   "photo": [{"file_id": "p", "file_unique_id": "up", "width": 1, "height": 1}]}
    item = message_payload(message(text="and?", reply_to_message=photo_reply), bot_id=BOT_ID)
    assert item is not None and item.reply is not None
    assert item.reply.text == "this chart" and item.reply.from_agent is False


@pytest.mark.parametrize("field, body, kind, name, duration", [
    ("voice", {"duration": 7, "mime_type": "audio/ogg"}, "voice", "voice.ogg", 7),
    ("audio", {"duration": 200, "file_name": "song.mp3"}, "audio", "song.mp3", 200),
    ("video", {"duration": 12, "width": 1, "height": 1}, "video", "video.mp4", 12),
    ("video_note", {"duration": 9, "length": 240}, "video_note", "video_note.mp4", 9),
    ("document", {"file_name": "a.pdf", "mime_type": "application/pdf"}, "document", "a.pdf", None),
])
def test_each_media_kind_becomes_a_file_with_its_kind_and_duration(field, body, kind, name, duration):
    item = message_payload(message(caption="look", **{field: {"file_id": "F", "file_unique_id": "uF", "file_size": 10,
                                                              **body}}))
    assert isinstance(item, MediaItem) and item.caption == "look"
    assert item.files == (FileRef(file_id="F", file_name=name, mime_type=item.files[0].mime_type, file_size=10,
                                  kind=kind, duration=duration, too_large=False),)


def test_an_animation_is_an_animation_not_the_document_telegram_also_sends():
    anim = {"file_id": "A", "file_unique_id": "uA", "width": 1, "height": 1, "duration": 3, "file_size": 5}
    item = message_payload(message(animation=anim, document={"file_id": "A", "file_unique_id": "uA"}))
    assert isinstance(item, MediaItem) and [f.kind for f in item.files] == ["animation"]


def test_the_largest_photo_size_is_taken_and_a_file_over_20_mb_is_marked():
    sizes = [{"file_id": "small", "file_unique_id": "s", "width": 9, "height": 9, "file_size": 100},
             {"file_id": "big", "file_unique_id": "b", "width": 99, "height": 99, "file_size": BOT_DOWNLOAD_LIMIT + 1}]
    item = message_payload(message(photo=sizes))
    assert isinstance(item, MediaItem) and item.files[0].file_id == "big" and item.files[0].too_large is True


def test_messages_from_bots_and_without_content_are_not_routed():
    assert message_payload(message(text="x", **{"from": {"id": 2, "is_bot": True, "first_name": "b"}})) is None
    assert message_payload(message(sticker={"file_id": "s", "file_unique_id": "us", "width": 1, "height": 1,
                                            "is_animated": False, "is_video": False, "type": "regular"})) is None


def test_an_edit_carries_the_new_text_else_the_caption_and_never_a_reserved_command():
    assert edit_payload(message(text="fixed", edit_date=2)) == EditItem(message_id=40, text="fixed")
    assert edit_payload(message(caption="new caption", edit_date=2)) == EditItem(message_id=40, text="new caption")
    assert edit_payload(message(text="/kill", edit_date=2), bot_username=BOT_NAME) is None
    assert edit_payload(message(text="//kill", edit_date=2), bot_username=BOT_NAME) == EditItem(40, "/kill")


# --- what each follower gets ---------------------------------------------------------------------------


def media(*files: FileRef, caption: str | None = "cap") -> MediaItem:
    return MediaItem(files=files, caption=caption, message_id=7, from_user_id=1, from_name="Ada", date=3)


def file(file_id: str, kind: str = "photo", too_large: bool = False) -> FileRef:
    return FileRef(file_id=file_id, file_name=f"{file_id}.bin", mime_type="x/y", file_size=4, kind=kind,
                   too_large=too_large)


def test_media_followers_get_media_and_the_others_the_first_downloadable_file_as_a_document():
    item = media(file("big", too_large=True), file("ok"))
    assert adapt_for(item, Capabilities.for_follower(["message", "media"])) == item
    old = adapt_for(item, Capabilities.for_follower())
    assert isinstance(old, MessageItem) and old.caption == "cap" and old.text is None
    assert old.document == DocumentRef(file_id="ok", file_name="ok.bin", mime_type="x/y", file_size=4)
    # An old follower decodes it as the message it always got.
    frame = decode_leader_frame(encode(leader_frame(records.Deliver("d-1", "i", "g", old))))
    assert isinstance(frame, Deliver) and frame.item.document is not None and frame.item.document.file_id == "ok"


def test_edits_and_controls_go_only_to_followers_that_take_them():
    edit = EditItem(message_id=1, text="x")
    assert adapt_for(edit, Capabilities.for_follower()) is None
    assert adapt_for(edit, Capabilities.for_follower(["message", "edit"])) == edit
    assert adapt_for(ControlItem("kill"), Capabilities.for_follower()) is None
    assert adapt_for(UnknownItem("unknown"), Capabilities.for_follower(["message", "media", "edit"])) is None


def test_an_album_folds_its_parts_in_order_with_the_caption_wherever_it_was():
    parts = [media(file("a"), caption=None), media(file("b"), caption="the trip"), media(file("c", "video"), caption=None)]
    album = combine_album(parts)
    assert isinstance(album, MediaItem) and [f.file_id for f in album.files] == ["a", "b", "c"]
    assert album.caption == "the trip" and album.message_id == 7
    # Telegram's limit of 10 parts is not ours: every part is kept.
    big = combine_album([media(file(str(i))) for i in range(12)])
    assert isinstance(big, MediaItem) and [f.file_id for f in big.files] == [str(i) for i in range(12)]


# --- words ---------------------------------------------------------------------------------------------


def test_previews_are_short_single_lines_that_say_what_the_item_is():
    assert preview(MessageItem(text="fix\nthe   tests")) == "fix the tests"
    assert preview(media(dataclasses.replace(file("v", "voice"), duration=65), caption=None)) == "📎 voice message 1:05"
    assert preview(media(file("a"), file("b"), caption="trip")) == "📎 album of 2: trip"
    assert preview(EditItem(message_id=1, text="better")) == "✏️ edit: better"
    assert len(preview(MessageItem(text="x" * 500))) == 60


@pytest.mark.parametrize("ms, text", [(0, "0 s"), (59_999, "59 s"), (60_000, "1 min"), (3_600_000, "1 h"),
                                      (3_900_000, "1 h 5 min"), (86_400_000, "24 h"), (3 * 86_400_000, "3 d")])
def test_ages_read_well_on_a_phone(ms: int, text: str):
    assert age_text(ms) == text


def test_the_too_large_notice_names_the_file_its_size_and_what_to_do():
    text = too_large_notice([dataclasses.replace(file("clip", "video"), file_name="clip.mp4",
                                                 file_size=31 * 1024 * 1024)])
    assert "video clip.mp4 (31.0 MB)" in text and "20 MB" in text and "smaller file" in text


def test_file_names_shown_in_the_topic_are_cleaned_like_those_typed_into_the_agent():
    hostile = dataclasses.replace(file("doc", "document"), file_name="huge.iso\n rm -rf ~\n", file_size=25_000_000,
                                  too_large=True)
    for text in (too_large_notice([hostile]), preview(MediaItem(files=(hostile,)))):
        assert "\n" not in text and "~" not in text and "huge.iso_ rm -rf _" in text


def test_the_expiry_sweep_interval_follows_the_ttl_within_bounds():
    assert expiry_interval_s(2_000) == 1.0 and expiry_interval_s(20_000) == 5.0 and expiry_interval_s(86_400_000) == 60.0


# --- reactions -----------------------------------------------------------------------------------------


def test_reactions_are_configurable_and_can_be_switched_off():
    assert reaction_emoji("👀") == "👀" and reaction_emoji(" 👍 ") == "👍"
    assert all(reaction_emoji(v) is None for v in ("", "off", "OFF", "false", "none", None))


def test_only_owner_messages_and_media_get_a_reaction_each_once():
    def row(seq: int, payload: records.InboundItem) -> JournalItem:
        return JournalItem(seq, seq, "k", payload, 0)

    rows = [row(1, MessageItem(text="a", message_id=10)), row(2, media(file("x"))),
            row(3, EditItem(message_id=10, text="b")), row(4, MessageItem(text="again", message_id=10)),
            row(5, MessageItem(text="no id"))]
    assert reacted_messages(rows) == [10, 7]
