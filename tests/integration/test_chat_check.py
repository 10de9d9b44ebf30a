"""bot/chat_check.py with the real PTB Bot over HTTP against the fake Bot API: the start-up verdict
on ``TOPICBUS_CHAT_ID``, with ``getChat`` and ``getChatMember`` asked at once (one round trip to
Telegram before readiness instead of two), and the member answer used only for a forum group."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from telegram import Bot

from tests.fakebotapi import DEFAULT_FORUM_CHAT_ID as CHAT_ID, FakeBotApi
from tests.integration.leader_env import TOKEN, Hold
from topicbus.bot.chat_check import check_chat
from topicbus.bot.gateway import TelegramGateway


@pytest.fixture
async def bot(fake: FakeBotApi) -> AsyncIterator[Bot]:
    async with Bot(TOKEN, base_url=fake.base_url, base_file_url=fake.base_file_url) as started:
        yield started


async def test_the_bot_s_membership_is_asked_while_the_chat_is_still_being_read(fake: FakeBotApi, bot: Bot):
    held = Hold(fake, "getChat")
    verdict = asyncio.create_task(check_chat(TelegramGateway(bot), CHAT_ID, bot.id))
    await asyncio.wait_for(held.entered.wait(), 5)
    await fake.wait_for(lambda: fake.calls_to("getChatMember"), 5)  # asked before getChat answered
    assert not verdict.done()
    held.release.set()
    assert (await asyncio.wait_for(verdict, 5)).fix is None
    assert len(fake.calls_to("getChat")) == len(fake.calls_to("getChatMember")) == 1


async def test_a_forum_without_the_bot_as_admin_gets_the_fix(bot: Bot):
    fake = FakeBotApi(bot_is_admin=False)
    async with fake:
        async with Bot(TOKEN, base_url=fake.base_url) as other:
            verdict = await check_chat(TelegramGateway(other), CHAT_ID, other.id)
    assert verdict.fix is not None and "is not an admin" in verdict.fix


async def test_a_group_without_topics_gets_its_fix_and_the_member_answer_is_not_needed(fake: FakeBotApi, bot: Bot):
    fake.add_forum(CHAT_ID, is_forum=False)
    verdict = await check_chat(TelegramGateway(bot), CHAT_ID, bot.id)
    assert verdict.fix == f"chat {CHAT_ID} has no topics: turn on Topics in the group's settings"


async def test_a_chat_telegram_does_not_know_gets_its_fix_and_nothing_is_left_running(fake: FakeBotApi, bot: Bot):
    verdict = await check_chat(TelegramGateway(bot), -1009876543210, bot.id)
    assert verdict.fix is not None and "Telegram does not know chat -1009876543210" in verdict.fix
    assert [t for t in asyncio.all_tasks() if t.get_name() == "chat-check-member"] == []


async def test_the_owner_s_private_chat_needs_no_membership_check(fake: FakeBotApi, bot: Bot):
    verdict = await check_chat(TelegramGateway(bot), 424242, bot.id)
    assert verdict.fix is None and verdict.note is None
