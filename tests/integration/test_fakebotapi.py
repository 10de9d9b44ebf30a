"""The fake Bot API server, driven by the real python-telegram-bot 22.8 client over HTTP."""

import asyncio
import datetime as dtm
import json
import urllib.request

import pytest
from telegram import Bot, InputFile, Update
from telegram.error import (BadRequest, Conflict, NetworkError, RetryAfter, TelegramError,
                            TimedOut)
from telegram.ext import Application, ContextTypes, ExtBot, MessageHandler, filters

from tests.fakebotapi import DEFAULT_FORUM_CHAT_ID, FakeBotApi

TOKEN = "123456:TEST-token-for-fake-server-0000000000"
CHAT = DEFAULT_FORUM_CHAT_ID


def make_bot(fake: FakeBotApi, cls: type[Bot] = Bot) -> Bot:
    return cls(token=TOKEN, base_url=fake.base_url, base_file_url=fake.base_file_url)


@pytest.fixture
async def bot(fake: FakeBotApi):
    async with make_bot(fake) as b:
        yield b


async def test_get_me_and_token_recorded(fake: FakeBotApi, bot: Bot) -> None:
    me = await bot.get_me()
    assert me.id == 999000111 and me.username == "topicbus_test_bot" and me.is_bot
    assert me.has_topics_enabled is True
    assert TOKEN in fake.tokens_seen
    assert fake.calls_to("getMe")[-1].status == 200


async def test_topic_lifecycle_and_error_mapping(fake: FakeBotApi, bot: Bot) -> None:
    topic = await bot.create_forum_topic(CHAT, "alpha")
    assert topic.message_thread_id == 2 and topic.name == "alpha" and topic.icon_color == 7322096
    second = await bot.create_forum_topic(CHAT, "beta", icon_color=16766590)
    assert second.message_thread_id == 3 and second.icon_color == 16766590

    assert await bot.edit_forum_topic(CHAT, 2, name="alpha 2") is True
    assert fake.topic(CHAT, 2).name == "alpha 2"
    with pytest.raises(BadRequest) as exc:
        await bot.edit_forum_topic(CHAT, 2, name="alpha 2")
    assert "topic_not_modified" in exc.value.message.lower()

    assert await bot.close_forum_topic(CHAT, 2) is True
    assert fake.topic(CHAT, 2).closed
    with pytest.raises(BadRequest, match="(?i)topic_not_modified"):
        await bot.close_forum_topic(CHAT, 2)
    assert await bot.reopen_forum_topic(CHAT, 2) is True
    with pytest.raises(BadRequest, match="(?i)topic_not_modified"):
        await bot.reopen_forum_topic(CHAT, 2)

    assert await bot.delete_forum_topic(CHAT, 2) is True
    assert fake.topic(CHAT, 2).deleted
    for call in (bot.delete_forum_topic(CHAT, 2), bot.edit_forum_topic(CHAT, 2, name="x"),
                 bot.close_forum_topic(CHAT, 99), bot.delete_forum_topic(CHAT, 1)):
        with pytest.raises(BadRequest) as exc:
            await call
        assert "message thread not found" in exc.value.message.lower()
    assert [c.status for c in fake.calls_to("deleteForumTopic")] == [200, 400, 400]


async def test_topic_name_color_and_chat_validation(fake: FakeBotApi, bot: Bot) -> None:
    for name in ("", "x" * 129):
        with pytest.raises(BadRequest, match="(?i)topic_name_invalid"):
            await bot.create_forum_topic(CHAT, name)
    with pytest.raises(BadRequest, match="(?i)topic_icon_color_invalid"):
        await bot.create_forum_topic(CHAT, "ok", icon_color=123)
    with pytest.raises(BadRequest, match="(?i)chat not found"):
        await bot.create_forum_topic(-100999, "ok")
    assert (await bot.create_forum_topic(CHAT, "x" * 128)).message_thread_id == 2
    # Private chats with a user have topics too; ids count per chat.
    assert (await bot.create_forum_topic(4242, "dm")).message_thread_id == 2
    assert [t.chat_id for t in fake.topics()] == [CHAT, 4242]


async def test_send_message_into_topic_and_deleted_topic(fake: FakeBotApi, bot: Bot) -> None:
    thread = (await bot.create_forum_topic(CHAT, "work")).message_thread_id
    msg = await bot.send_message(CHAT, "123", message_thread_id=thread)
    assert msg.text == "123" and msg.message_thread_id == thread and msg.is_topic_message
    assert msg.chat.is_forum and msg.from_user.id == fake.bot_user["id"]
    general = await bot.send_message(CHAT, "to general")
    assert general.message_thread_id is None and general.message_id > msg.message_id
    assert [m.text for m in fake.messages_in(CHAT, thread)] == ["123"]
    assert [m.text for m in fake.messages_in(CHAT, None)] == ["to general"]

    fake.user_delete_topic(CHAT, thread)
    with pytest.raises(BadRequest, match="(?i)message thread not found"):
        await bot.send_message(CHAT, "lost", message_thread_id=thread)
    with pytest.raises(BadRequest, match="(?i)message thread not found"):
        await bot.send_message(CHAT, "general id", message_thread_id=1)
    with pytest.raises(BadRequest, match="(?i)message text is empty"):
        await bot.send_message(CHAT, "")
    with pytest.raises(BadRequest, match="(?i)message is too long"):
        await bot.send_message(CHAT, "x" * 4097)
    assert await bot.send_chat_action(CHAT, "typing") is True
    assert fake.sent[-1].kind == "chat_action" and fake.sent[-1].text == "typing"
    assert len(fake.sent) == 3


async def test_send_document_multipart_upload(fake: FakeBotApi, bot: Bot) -> None:
    thread = (await bot.create_forum_topic(CHAT, "files")).message_thread_id
    payload = bytes(range(256)) * 8
    msg = await bot.send_document(CHAT, InputFile(payload, filename="out.bin"),
                                  caption="42", message_thread_id=thread)
    assert msg.document.file_name == "out.bin" and msg.document.file_size == len(payload)
    assert msg.caption == "42" and msg.message_thread_id == thread
    sent = fake.messages_in(CHAT, thread)[-1]
    assert (sent.kind, sent.document_name, sent.document_bytes, sent.caption) == (
        "document", "out.bin", payload, "42")
    # The file can be downloaded back through getFile + base_file_url.
    file = await bot.get_file(msg.document.file_id)
    assert bytes(await file.download_as_bytearray()) == payload


async def test_retry_after_from_fail_next_with_predicate(fake: FakeBotApi, bot: Bot) -> None:
    await bot.create_forum_topic(CHAT, "a")
    await bot.create_forum_topic(CHAT, "b")
    fake.fail_next("sendMessage", status=429, retry_after=7,
                   when=lambda p: p.get("message_thread_id") == 3)
    assert (await bot.send_message(CHAT, "a ok", message_thread_id=2)).text == "a ok"
    with pytest.raises(RetryAfter) as exc:
        await bot.send_message(CHAT, "b", message_thread_id=3)
    assert exc.value.retry_after == dtm.timedelta(seconds=7)
    assert (await bot.send_message(CHAT, "b ok", message_thread_id=3)).text == "b ok"
    assert [c.status for c in fake.calls_to("sendMessage")] == [200, 429, 200]
    assert len(fake.messages_in(CHAT, 3)) == 1


async def test_injected_bad_request_and_result_false(fake: FakeBotApi, bot: Bot) -> None:
    fake.fail_next("createForumTopic", description="Bad Request: not enough rights to create "
                   "a topic", times=2)
    for _ in range(2):
        with pytest.raises(BadRequest, match="(?i)not enough rights"):
            await bot.create_forum_topic(CHAT, "t")
    fake.result_false_next("closeForumTopic")
    assert await bot.close_forum_topic(CHAT, 12345) is False
    assert (await bot.create_forum_topic(CHAT, "t")).message_thread_id == 2


async def test_drop_next_is_a_network_error(fake: FakeBotApi, bot: Bot) -> None:
    fake.drop_next("sendMessage")
    with pytest.raises(NetworkError) as exc:
        await bot.send_message(CHAT, "dropped")
    assert not isinstance(exc.value, BadRequest)
    assert fake.calls_to("sendMessage")[-1].status == 0 and fake.sent == []
    assert (await bot.send_message(CHAT, "next")).text == "next"


async def test_malformed_response_is_a_plain_telegram_error(fake: FakeBotApi, bot: Bot) -> None:
    fake.malformed_next("getMe")
    with pytest.raises(TelegramError, match="Invalid server response") as exc:
        await bot.get_me()
    assert not isinstance(exc.value, NetworkError)  # PTB: not a network error, not retried
    assert (await bot.get_me()).id == 999000111


async def test_delay_next_times_out_but_was_applied(fake: FakeBotApi, bot: Bot) -> None:
    fake.delay_next("sendMessage", 0.4)
    with pytest.raises(TimedOut):
        await bot.send_message(CHAT, "slow", read_timeout=0.1)
    # Like Telegram: the request timed out for the client but the message was delivered.
    await fake.wait_for(lambda: [m.text for m in fake.sent] == ["slow"], timeout=2)
    assert (await bot.send_message(CHAT, "fast", read_timeout=2)).text == "fast"


async def test_get_updates_offset_semantics(fake: FakeBotApi, bot: Bot) -> None:
    first = fake.push_message(CHAT, "one")
    fake.push_message(CHAT, "two")
    assert first["update_id"] == 1
    updates = await bot.get_updates(timeout=0)
    assert [u.update_id for u in updates] == [1, 2]
    assert [u.message.text for u in updates] == ["one", "two"]
    assert len(fake.pending_updates()) == 2  # not confirmed until the next offset
    assert [u.update_id for u in await bot.get_updates(offset=2, timeout=0)] == [2]
    assert [u["update_id"] for u in fake.pending_updates()] == [2]
    fake.push_message(CHAT, "three")
    assert [u.update_id for u in await bot.get_updates(offset=3, limit=5, timeout=0)] == [3]
    assert await bot.get_updates(offset=4, timeout=0) == ()
    assert fake.pending_updates() == [] and fake.get_updates_calls == 4


async def test_long_poll_wakes_up_on_push(fake: FakeBotApi, bot: Bot) -> None:
    thread = (await bot.create_forum_topic(CHAT, "inbox")).message_thread_id

    async def push_later() -> None:
        # Counted as the fake starts serving the poll, which then waits without yielding in between.
        await fake.wait_for(lambda: fake.get_updates_calls == 1, timeout=2)
        fake.push_message(CHAT, "hello", thread_id=thread, from_id=4242)

    pusher = asyncio.create_task(push_later())
    # The poll returns on the push: a poll that slept through it would be cut off by this deadline,
    # long before its own 30 s timeout.
    updates = await asyncio.wait_for(bot.get_updates(timeout=30), 10)
    await pusher
    assert len(updates) == 1
    msg = updates[0].message
    assert msg.text == "hello" and msg.message_thread_id == thread and msg.is_topic_message
    assert msg.chat.is_forum and msg.from_user.id == 4242
    assert msg.reply_to_message.forum_topic_created.name == "inbox"


async def test_long_poll_times_out_empty(fake: FakeBotApi, bot: Bot) -> None:
    assert await bot.get_updates(timeout=0.2) == ()
    assert fake.calls_to("getUpdates")[-1].params["timeout"] == 0.2


async def test_concurrent_get_updates_conflict(fake: FakeBotApi) -> None:
    async with make_bot(fake) as first, make_bot(fake, ExtBot) as second:
        polling = asyncio.create_task(first.get_updates(timeout=3))
        await fake.wait_for(lambda: fake.get_updates_calls == 1, timeout=2)
        assert await second.get_updates(timeout=0) == ()
        with pytest.raises(Conflict, match="terminated by other getUpdates request"):
            await polling
    assert fake.conflicts == 1
    assert sorted(c.status for c in fake.calls_to("getUpdates")) == [200, 409]


async def test_reject_new_conflict_policy() -> None:
    async with FakeBotApi(conflict_policy="reject_new") as fake, make_bot(fake) as first, \
            make_bot(fake) as second:
        polling = asyncio.create_task(first.get_updates(timeout=3))
        await fake.wait_for(lambda: fake.get_updates_calls == 1, timeout=2)
        with pytest.raises(Conflict):
            await second.get_updates(timeout=0)
        fake.push_message(CHAT, "still mine")
        assert [u.message.text for u in await polling] == ["still mine"]
        assert fake.conflicts == 1


async def test_topic_events_parse_into_updates(fake: FakeBotApi, bot: Bot) -> None:
    thread = (await bot.create_forum_topic(CHAT, "agent")).message_thread_id
    fake.push_topic_event(CHAT, thread, "closed")
    fake.push_topic_event(CHAT, thread, "reopened")
    fake.push_topic_event(CHAT, thread, "edited", name="renamed")
    created = fake.push_topic_event(CHAT, None, "created", name="by user")
    assert fake.topic(CHAT, thread).name == "renamed" and not fake.topic(CHAT, thread).closed
    user_thread = created["message"]["message_thread_id"]
    assert fake.topic(CHAT, user_thread).name == "by user"

    updates = await bot.get_updates(timeout=0)
    assert all(isinstance(u, Update) for u in updates)
    closed, reopened, edited, made = (u.message for u in updates)
    assert closed.forum_topic_closed is not None and closed.message_thread_id == thread
    assert closed.is_topic_message and closed.chat.is_forum
    assert reopened.forum_topic_reopened is not None
    assert edited.forum_topic_edited.name == "renamed"
    assert made.forum_topic_created.name == "by user" and made.message_id == user_thread
    assert (await bot.create_forum_topic(CHAT, "next")).message_thread_id > user_thread

    fake.push_topic_event(CHAT, thread, "closed")
    with pytest.raises(BadRequest, match="(?i)topic_not_modified"):
        await bot.close_forum_topic(CHAT, thread)


async def test_edited_and_raw_updates(fake: FakeBotApi, bot: Bot) -> None:
    fake.push_edited_message(CHAT, 77, "fixed")
    raw = fake.push_update({"weird": {"x": 1}})
    assert raw["update_id"] == 2
    updates = await bot.get_updates(timeout=0)
    assert updates[0].edited_message.text == "fixed" and updates[0].edited_message.message_id == 77
    assert updates[1].update_id == 2 and updates[1].message is None


async def test_callback_queries_carry_the_message_and_are_answered_once(fake: FakeBotApi, bot: Bot) -> None:
    from telegram import InlineKeyboardButton, InlineKeyboardMarkup

    thread = (await bot.create_forum_topic(CHAT, "t")).message_thread_id
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("Yes", callback_data="k:y")]])
    sent = await bot.send_message(CHAT, "Go?", message_thread_id=thread, reply_markup=keyboard)
    pushed = fake.push_callback_query(CHAT, sent.message_id, "k:y", from_id=5, first_name="Eve")
    (update,) = await bot.get_updates(timeout=0)
    query = update.callback_query
    assert query.data == "k:y" and query.from_user.id == 5 and query.message.message_id == sent.message_id
    assert query.message.message_thread_id == thread and query.message.text == "Go?"
    assert query.message.reply_markup.inline_keyboard[0][0].callback_data == "k:y"
    assert await bot.answer_callback_query(query.id, "nope", show_alert=True) is True
    assert [(a.text, a.show_alert) for a in fake.answers_to(pushed)] == [("nope", True)]
    with pytest.raises(BadRequest, match="(?i)query is too old"):
        await bot.answer_callback_query(query.id, "again")
    with pytest.raises(BadRequest, match="(?i)query is too old"):
        await bot.answer_callback_query("never-issued")

    # An edit without a keyboard removes it, as Telegram does; a redelivered update keeps its id.
    await bot.edit_message_text("Go?\n\nYes", chat_id=CHAT, message_id=sent.message_id)
    assert fake.messages_in(CHAT, thread)[0].reply_markup is None
    assert await bot.get_updates(offset=update.update_id + 1, timeout=0) == ()  # confirmed
    fake.redeliver(pushed)
    (again,) = await bot.get_updates(timeout=0)
    assert again.update_id == update.update_id and again.callback_query.id == query.id
    with pytest.raises(ValueError):
        fake.push_callback_query(CHAT, 9999, "k:y")


async def test_flood_limiter(fake: FakeBotApi, bot: Bot) -> None:
    fake.set_flood_limit(3, retry_after=5)
    await bot.create_forum_topic(CHAT, "t")
    await bot.send_message(CHAT, "1", message_thread_id=2)
    await bot.edit_forum_topic(CHAT, 2, name="t2")
    with pytest.raises(RetryAfter) as exc:
        await bot.send_message(CHAT, "2", message_thread_id=2)
    assert exc.value.retry_after.total_seconds() == 5
    assert fake.flood_rejections == 1 and fake.calls_to("sendMessage")[-1].status == 429
    # Another chat has its own budget; chat actions are not counted.
    assert (await bot.send_message(4242, "dm")).chat.type == "private"
    assert await bot.send_chat_action(CHAT, "typing")
    fake.set_flood_limit(None)
    assert (await bot.send_message(CHAT, "2", message_thread_id=2)).text == "2"


async def test_raw_http_parsing_and_errors(fake: FakeBotApi) -> None:
    def post(method: str, body: bytes, content_type: str) -> tuple[int, dict]:
        req = urllib.request.Request(f"{fake.base_url}tok/{method}", data=body,
                                     headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    status, body = await asyncio.to_thread(
        post, "sendMessage", json.dumps({"chat_id": CHAT, "text": 5}).encode(), "application/json")
    assert status == 200 and body["result"]["text"] == "5"
    status, body = await asyncio.to_thread(
        post, "sendMessage", b"chat_id=-100999&text=x", "application/x-www-form-urlencoded")
    assert (status, body) == (400, {"ok": False, "error_code": 400,
                                    "description": "Bad Request: chat not found"})
    status, body = await asyncio.to_thread(post, "noSuchMethod", b"", "application/json")
    assert (status, body) == (404, {"ok": False, "error_code": 404, "description": "Not Found"})
    assert "tok" in fake.tokens_seen and fake.calls[-1].status == 404
    fake.reset_calls()
    assert fake.calls == []


async def test_wait_for_reports_state_on_timeout(fake: FakeBotApi) -> None:
    with pytest.raises(AssertionError, match="(?s)never happens.*topics="):
        await fake.wait_for(lambda: False, timeout=0.1, message="never happens")


async def test_application_polls_replies_and_confirms_on_stop(fake: FakeBotApi) -> None:
    received: list[Update] = []

    async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        received.append(update)
        await update.message.reply_text(f"echo {update.message.text}")

    app = (Application.builder().token(TOKEN).base_url(fake.base_url)
           .base_file_url(fake.base_file_url).get_updates_read_timeout(2).build())
    app.add_handler(MessageHandler(filters.TEXT, echo))
    thread = fake.push_topic_event(CHAT, None, "created", name="agent")["message"][
        "message_thread_id"]
    async with app:
        await app.updater.start_polling(poll_interval=0, timeout=1)
        await app.start()
        fake.push_message(CHAT, "hi", thread_id=thread)
        await fake.wait_for(lambda: fake.messages_in(CHAT, thread), timeout=5,
                            message="no echo in the topic")
        await app.updater.stop()
        await app.stop()
    assert [m.text for m in fake.messages_in(CHAT, thread)] == ["echo hi"]
    assert len(received) == 1
    assert fake.pending_updates() == []  # PTB's final getUpdates confirmed the offset
    assert fake.conflicts == 0
