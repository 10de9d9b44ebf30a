"""Inline buttons on the leader's side (docs/architecture.md, "A button press") with the real PTB Application, the real
handlers and poller against the fake Bot API, over a real store: a follower's buttons with short
callback ids, owners only, stale presses, exactly once across a second press and a redelivered
update, a follower without button-v1, and the Interrupt button of a printing agent."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from tests.fakebotapi import DEFAULT_USER_ID, SentMessage
from tests.integration.leader_env import CHAT, LeaderEnv, fenced
from tests.integration.test_inbound import WAIT, Polled, caps, polled  # noqa: F401 - the fixture
from topicbus.core.output import OutputConfig
from topicbus.leader.buttons import (ALREADY, CANNOT_TAKE, EARLIER_PROCESS, ENDED, INTERRUPT_REFUSED, INTERRUPTED,
                                     KEPT_OFFLINE, SENT, STALE, STRANGER)
from topicbus.leader.keyboards import INTERRUPT_LABEL
from topicbus.leader.outbound import OutboundOptions
from topicbus.protocol import decode_frame, encode, send_frame, text_message

STRANGER_ID = 777
LONG_DATA = "deploy:" + "x" * 300  # far beyond Telegram's 64 bytes of callback data
CALLBACK = re.compile(r"k:[A-Za-z0-9_-]{16}:\d")


async def say(env: LeaderEnv, instance_id: str, text: str, *, generation: str = "g1",
              buttons: list[list[dict[str, str]]] | None = None) -> None:
    message = text_message(text) | ({"buttons": buttons} if buttons else {})
    frame = send_frame(f"{instance_id}:{uuid.uuid4().hex[:6]}", instance_id, generation, message)
    await env.services.followers.send(decode_frame(encode(frame)))


async def posted(env: LeaderEnv, thread: int, text: str) -> SentMessage:
    """The message ``text`` once it is out with its keyboard, and the leader knows its message id."""
    message = await env.fake.wait_for(
        lambda: next((m for m in env.fake.messages_in(CHAT, thread) if m.text == text and m.reply_markup), None),
        WAIT, f"{text!r} with a keyboard in thread {thread}")
    await recorded(env, message)
    return message


async def recorded(env: LeaderEnv, message: SentMessage) -> None:
    assert env.db is not None
    db = env.db

    async def known() -> bool:
        return await db.fetch_value("SELECT COUNT(*) FROM inline_keyboards WHERE message_id = ?",
                                    (message.message_id,)) > 0

    await env.fake.wait_for(known, WAIT, f"the keyboard of message {message.message_id} recorded")


def outputs(env: LeaderEnv, thread: int) -> list[SentMessage]:
    """The topic's messages, without the one-line "✓ …" that ends a quiet stream."""
    return [m for m in env.fake.messages_in(CHAT, thread) if not (m.text or "").startswith("✓")]


def callbacks(message: SentMessage) -> list[tuple[str, str]]:
    """(label, callback data) of every button under a message."""
    return [(b["text"], b["callback_data"]) for row in (message.reply_markup or {})["inline_keyboard"] for b in row]


def press(env: LeaderEnv, message: SentMessage, label: str, *, from_id: int = DEFAULT_USER_ID,
          data: str | None = None) -> dict[str, Any]:
    """A press on ``message``'s button ``label`` (``data``: its callback data, from a phone that still
    shows a button the message no longer has)."""
    data = data or dict(callbacks(message))[label]
    assert message.message_id is not None
    return env.fake.push_callback_query(CHAT, message.message_id, data, from_id=from_id,
                                        first_name="Owner" if from_id == DEFAULT_USER_ID else "Stranger")


async def answer(env: LeaderEnv, update: dict[str, Any]) -> tuple[str | None, bool]:
    found = await env.fake.wait_for(lambda: env.fake.answers_to(update), WAIT, "the answer to a press")
    return found[0].text, found[0].show_alert


def of_type(polled_: Polled, instance: str, kind: str) -> list[dict[str, Any]]:
    return [i for i in polled_.items(instance) if i["type"] == kind]


async def journal_rows(env: LeaderEnv) -> list[tuple[str, str]]:
    assert env.db is not None
    rows = await env.db.fetch_all("SELECT payload, status FROM inbound_journal ORDER BY seq")
    return [(json.loads(r["payload"])["type"], r["status"]) for r in rows]


YES_NO = [[{"text": "Yes", "data": LONG_DATA}, {"text": "No", "data": "n"}]]


# --- a follower's buttons ------------------------------------------------------------------------------


async def test_buttons_carry_short_ids_and_an_owners_press_reaches_the_follower_once(env: LeaderEnv,
                                                                                  polled: Polled):
    services = await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("button", "control")))["threadId"]
    await say(env, "a", "Deploy? [y/N]", buttons=YES_NO)
    message = await posted(env, thread, "Deploy? [y/N]")
    # The follower's buttons win over the Interrupt button; the data stays with the leader.
    assert [label for label, _ in callbacks(message)] == ["Yes", "No"]
    for _, data in callbacks(message):
        assert CALLBACK.fullmatch(data) and len(data.encode()) <= 64 and "deploy" not in data

    shown_before = dict(callbacks(message))
    yes = press(env, message, "Yes")
    (item,) = await polled.wait_items("a", 1)
    assert item == {"type": "button", "data": LONG_DATA, "messageId": message.message_id,
                    "fromUserId": DEFAULT_USER_ID}
    assert await answer(env, yes) == (SENT.format(label="Yes"), False)
    await env.fake.wait_for(lambda: message.reply_markup is None, WAIT, "the buttons removed")
    assert message.text == "Deploy? [y/N]\n\n👉 Yes" and message.edits == 1

    assert message.message_id is not None  # a client that still shows the buttons:
    no = env.fake.push_callback_query(CHAT, message.message_id, shown_before["No"])
    assert await answer(env, no) == (ALREADY.format(label="Yes"), True)
    await polled.ack_all("a")
    assert await journal_rows(env) == [("button", "delivered")]
    assert of_type(polled, "a", "button") == [item]
    assert services.buttons.outcomes == {"sent": 1, "answered": 1}


async def test_a_strangers_press_gets_an_alert_and_changes_nothing(env: LeaderEnv, polled: Polled):
    await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("button")))["threadId"]
    await say(env, "a", "Pick one", buttons=YES_NO)
    message = await posted(env, thread, "Pick one")
    stranger = press(env, message, "Yes", from_id=STRANGER_ID)
    assert await answer(env, stranger) == (STRANGER, True)
    await polled.confirmed()
    assert await journal_rows(env) == [] and polled.items("a") == []
    assert message.reply_markup is not None and message.edits == 0

    owner = press(env, message, "No")  # the buttons still work for an owner
    (item,) = await polled.wait_items("a", 1)
    assert item["data"] == "n" and await answer(env, owner) == (SENT.format(label="No"), False)


async def test_stale_presses_get_an_alert_and_change_nothing(env: LeaderEnv, polled: Polled):
    services = await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("button")))["threadId"]
    await say(env, "a", "First", buttons=YES_NO)
    await say(env, "a", "Second", buttons=[[{"text": "OK", "data": "ok"}]])
    first, second = await posted(env, thread, "First"), await posted(env, thread, "Second")
    assert first.message_id is not None and second.message_id is not None

    unknown = env.fake.push_callback_query(CHAT, first.message_id, "k:AAAAAAAAAAAAAAAA:0")
    garbage = env.fake.push_callback_query(CHAT, first.message_id, "not ours")
    moved = env.fake.push_callback_query(CHAT, second.message_id, dict(callbacks(first))["Yes"])
    beyond = env.fake.push_callback_query(CHAT, first.message_id, dict(callbacks(first))["No"][:-1] + "7")
    for update in (unknown, garbage, moved, beyond):
        assert await answer(env, update) == (STALE, True)
    await polled.confirmed()
    assert await journal_rows(env) == [] and polled.items("a") == []
    assert first.reply_markup is not None and second.reply_markup is not None
    assert services.buttons.outcomes == {"stale": 4}


async def test_buttons_of_an_earlier_process_do_nothing_for_its_successor(env: LeaderEnv, polled: Polled):
    await polled.start()
    thread = (await env.register("first", cwd="/w", protocol=caps("button")))["threadId"]
    await say(env, "first", "Overwrite?", buttons=YES_NO)
    message = await posted(env, thread, "Overwrite?")
    await env.register("second", cwd="/w", generation="g2", protocol=caps("button"))  # supersedes "first"
    update = press(env, message, "Yes")
    assert await answer(env, update) == (EARLIER_PROCESS, True)
    await polled.confirmed()
    assert await journal_rows(env) == [] and polled.items("second") == []
    assert message.reply_markup is not None


async def test_a_press_for_an_offline_follower_waits_for_that_process_and_never_reaches_a_successor(
        env: LeaderEnv, polled: Polled):
    await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("button")))["threadId"]
    await say(env, "a", "Retry?", buttons=YES_NO)
    await say(env, "a", "Clean?", buttons=[[{"text": "Clean", "data": "clean"}]])
    retry, clean = await posted(env, thread, "Retry?"), await posted(env, thread, "Clean?")
    polled.go_offline("a")
    first = press(env, retry, "No")
    assert await answer(env, first) == (KEPT_OFFLINE.format(label="No"), False)
    await env.fake.wait_for(lambda: retry.reply_markup is None, WAIT, "the choice shown")
    # The same process reconnects (a new registration generation): it gets the press.
    env.connections.pop("a")
    await env.register("a", cwd="/w", generation="g2", protocol=caps("button"))
    (item,) = await polled.wait_items("a", 1)
    assert item["data"] == "n"
    await polled.ack_all("a")

    polled.go_offline("a")
    second = press(env, clean, "Clean")
    assert await answer(env, second) == (KEPT_OFFLINE.format(label="Clean"), False)
    await env.register("b", cwd="/w", generation="g3", protocol=caps("button"))  # a successor process
    env.fake.push_message(CHAT, "hello b", thread_id=thread)
    (hello,) = await polled.wait_items("b", 1)
    assert hello["type"] == "message" and hello["text"] == "hello b"
    assert await polled.statuses() == ["delivered", "skipped", "pending"]


async def test_buttons_of_a_program_that_ended_do_nothing(env: LeaderEnv, polled: Polled):
    env.cleanup = False  # the topic is kept after the agent leaves
    await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("button")))["threadId"]
    await say(env, "a", "Keep going?", buttons=YES_NO)
    message = await posted(env, thread, "Keep going?")
    await env.services.followers.disconnect(fenced("follower.disconnect", "a", "g1"))  # its program exited
    update = press(env, message, "Yes")
    assert await answer(env, update) == (ENDED, True)
    await polled.confirmed()
    assert await journal_rows(env) == [] and message.reply_markup is not None


async def test_a_press_redelivered_after_a_leader_crash_is_delivered_once_and_the_choice_still_shown(
        env: LeaderEnv, polled: Polled):
    await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("button")))["threadId"]
    await say(env, "a", "Ship it?", buttons=YES_NO)
    message = await posted(env, thread, "Ship it?")
    env.fake.drop_next("editMessageText", times=100)  # this term never gets the choice shown
    update = press(env, message, "Yes")
    (item,) = await polled.wait_items("a", 1)
    await env.fake.wait_for(lambda: env.fake.calls_to("editMessageText"), WAIT, "an attempt to show the choice")
    first_delivery = env.connections["a"].deliveries()[0]["deliveryId"]

    # The leader dies before the update was confirmed: Telegram hands it over again. The follower
    # never sent its receipt, so it gets the press again, with the same delivery id (it drops it).
    await polled.stop()
    env.fake.clear_faults("editMessageText")
    env.fake.redeliver(update)
    services = await polled.restart()
    env.connections.pop("a")
    await env.register("a", cwd="/w", generation="g2", protocol=caps("button"))
    (again,) = await polled.wait_items("a", 1)
    assert again == item and env.connections["a"].deliveries()[0]["deliveryId"] == first_delivery
    await polled.confirmed()
    assert services.buttons.outcomes == {"repeat": 1}
    assert await journal_rows(env) == [("button", "pending")]
    await env.fake.wait_for(lambda: message.reply_markup is None, WAIT, "the choice shown by the new term")
    assert message.text == "Ship it?\n\n👉 Yes"


async def test_a_follower_without_button_v1_never_gets_a_press(env: LeaderEnv, polled: Polled):
    services = await polled.start()
    thread = (await env.register("old", cwd="/old"))["threadId"]  # deliver-v1 only
    await say(env, "old", "Proceed?", buttons=YES_NO)
    message = await posted(env, thread, "Proceed?")
    update = press(env, message, "Yes")
    assert await answer(env, update) == (CANNOT_TAKE, True)
    await polled.confirmed()
    assert await journal_rows(env) == [] and polled.items("old") == []
    assert message.reply_markup is not None and services.buttons.outcomes == {"cannot-take": 1}


# --- the Interrupt button ------------------------------------------------------------------------------


def printing_env(env: LeaderEnv) -> None:
    """No waiting between the edits that grow a live message (the default is 4 s)."""
    env.outbound_options = OutboundOptions(budget=env.outbound_options.budget,
                                           output=OutputConfig(edit_interval_ms=0))


def showing(env: LeaderEnv, thread: int, needle: str) -> SentMessage | None:
    return next((m for m in outputs(env, thread) if needle in (m.text or "")), None)


async def printing(env: LeaderEnv, instance: str, thread: int, *, generation: str = "g1") -> SentMessage:
    """The agent prints two lines in a row: the first goes out, the second grows that message (an
    edit, at once in these tests); returns the message that shows the second line."""
    await say(env, instance, f"{instance} step 1", generation=generation)
    await env.fake.wait_for(lambda: showing(env, thread, f"{instance} step 1"), WAIT, "the first line")
    await say(env, instance, f"{instance} step 2", generation=generation)
    message = await env.fake.wait_for(lambda: showing(env, thread, f"{instance} step 2"), WAIT, "the second line")
    if message.reply_markup:
        await recorded(env, message)
    return message


async def test_the_interrupt_button_rides_on_the_printing_agents_live_message(env: LeaderEnv, polled: Polled):
    printing_env(env)
    await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("control")))["threadId"]
    live = await printing(env, "a", thread)
    assert live.text == "a step 1\na step 2" and [label for label, _ in callbacks(live)] == [INTERRUPT_LABEL]
    assert outputs(env, thread) == [live] and live.edits == 1  # no message and no edit for the button alone

    stranger = press(env, live, INTERRUPT_LABEL, from_id=STRANGER_ID)
    assert await answer(env, stranger) == (STRANGER, True)
    owner = press(env, live, INTERRUPT_LABEL)
    (control,) = await polled.wait_items("a", 1)
    assert control == {"type": "control", "action": "interrupt", "messageId": live.message_id}
    assert await answer(env, owner) == (INTERRUPTED, False)
    # The owner's press ended the turn: the button comes off, by an edit of its own at the lowest priority.
    await env.fake.wait_for(lambda: live.reply_markup is None, WAIT, "the Interrupt button taken off")
    assert live.text == "a step 1\na step 2" and live.edits == 1

    # A follower without control-v1, and a whole answer that fits in one message: no button.
    quiet = (await env.register("q", cwd="/q"))["threadId"]
    await printing(env, "q", quiet)
    await say(env, "a", "done.")  # a's stream went on: a new message of the same stream
    await env.fake.wait_for(lambda: showing(env, thread, "done."), WAIT, "done.")
    (q_message,) = outputs(env, quiet)
    assert q_message.text == "q step 1\nq step 2" and q_message.reply_markup is None


async def test_the_interrupt_button_reaches_only_the_generation_that_printed_it(env: LeaderEnv, polled: Polled):
    printing_env(env)
    await polled.start()
    thread = (await env.register("a", cwd="/w", protocol=caps("control")))["threadId"]
    live = await printing(env, "a", thread)
    data = dict(callbacks(live))[INTERRUPT_LABEL]  # a phone may show it after the press took it off

    await env.register("a", cwd="/w", generation="g2", protocol=caps("control"))  # it reconnected
    reconnected = press(env, live, INTERRUPT_LABEL, data=data)
    assert await answer(env, reconnected) == (INTERRUPT_REFUSED["earlier-process"], True)
    await env.register("b", cwd="/w", generation="g3", protocol=caps("control"))  # a successor process
    successor = press(env, live, INTERRUPT_LABEL, data=data)
    assert await answer(env, successor) == (INTERRUPT_REFUSED["earlier-process"], True)
    await polled.confirmed()
    assert polled.items("a") == [] and polled.items("b") == []

    # The successor's own output gets its own button, which reaches it.
    env.fake.reset_calls()
    own = await printing(env, "b", thread, generation="g3")
    assert [label for label, _ in callbacks(own)] == [INTERRUPT_LABEL]
    update = press(env, own, INTERRUPT_LABEL)
    (control,) = await polled.wait_items("b", 1)
    assert control["action"] == "interrupt" and await answer(env, update) == (INTERRUPTED, False)
