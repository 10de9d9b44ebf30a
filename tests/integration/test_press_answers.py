"""The press-answer lane with the real PTB Bot against the fake Bot API: an answer that
Telegram refused with RetryAfter waits out the pause, and one whose deadline passed meanwhile is
dropped, never sent late; the chat's own RetryAfter pause holds the lane too."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from telegram import Bot

from tests.fakebotapi import FakeBotApi
from tests.integration.leader_env import CHAT, TOKEN
from topicbus.bot.gateway import TelegramGateway
from topicbus.core.press_answers import Offer, PressAnswerConfig
from topicbus.leader.press_answers import PressAnswerLane

WAIT = 10.0


@pytest.fixture
async def bot(fake: FakeBotApi) -> AsyncIterator[Bot]:
    async with Bot(TOKEN, base_url=fake.base_url) as bot:
        yield bot


async def pressed(fake: FakeBotApi, bot: Bot, data: str) -> str:
    """A press of a button under a message the bot sent; its query id."""
    message = await bot.send_message(CHAT, f"Pick {data}")
    return fake.push_callback_query(CHAT, message.message_id, data)["callback_query"]["id"]


def answered(fake: FakeBotApi, query_id: str) -> list[str | None]:
    return [a.text for a in fake.callback_answers if a.query_id == query_id]


async def test_an_answer_refused_with_retry_after_is_retried_after_the_pause_or_dropped_once_late(
        fake: FakeBotApi, bot: Bot):
    old, new = await pressed(fake, bot, "a"), await pressed(fake, bot, "b")
    lane = PressAnswerLane(TelegramGateway(bot), PressAnswerConfig())
    fake.fail_next("answerCallbackQuery", status=429, retry_after=2)
    now = lane.now()
    # The first press arrived 13 s ago: one second is left of its 14, less than the pause Telegram asks for.
    assert lane.offer((1, CHAT, 2, "a"), old, "old", alert=False, by_owner=True, arrived_at=now - 13.0) is Offer.QUEUED
    assert lane.offer((1, CHAT, 3, "b"), new, "new", alert=False, by_owner=True, arrived_at=now) is Offer.QUEUED
    lane.start()
    try:
        await fake.wait_for(lambda: answered(fake, new), WAIT, "the second press answered after the pause")
    finally:
        await lane.stop()
    assert answered(fake, new) == ["new"] and answered(fake, old) == []
    assert [c.status for c in fake.calls_to("answerCallbackQuery")] == [429, 200]
    assert lane.counts == {"queued": 2, "sent": 2, "late": 1}  # the refused one was taken once, then too late


async def test_the_chats_retry_after_pause_holds_the_lane_and_a_late_answer_is_dropped(fake: FakeBotApi, bot: Bot):
    first, second = await pressed(fake, bot, "a"), await pressed(fake, bot, "b")
    # The chat is paused for 2 s (the outbound scheduler learned a RetryAfter); this answer has 1 s.
    pause_ends = time.monotonic() + 2.0  # the lane's clock
    lane = PressAnswerLane(TelegramGateway(bot), PressAnswerConfig(answerable_s=1.0), paused_until=lambda: pause_ends)
    lane.start()
    try:
        lane.offer((1, CHAT, 2, "a"), first, "first", alert=False, by_owner=True, arrived_at=lane.now())
        await fake.wait_for(lambda: lane.counts.get("late"), WAIT, "the answer dropped once the pause ended")
        lane.offer((1, CHAT, 3, "b"), second, "second", alert=False, by_owner=True, arrived_at=lane.now())
        await fake.wait_for(lambda: answered(fake, second), WAIT, "an answer once the pause is over")
    finally:
        await lane.stop()
    assert answered(fake, first) == [] and len(fake.calls_to("answerCallbackQuery")) == 1
