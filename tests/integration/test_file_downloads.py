"""``TelegramGateway.open_download`` with the real PTB Bot against the fake Bot API: a file's bytes
come as a stream of bounded chunks with the size Telegram announced; a file Telegram refuses is a
REJECTED outcome before any byte; a file that breaks off is a :class:`DownloadInterrupted` whose
message names no token (the file's URL carries it)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import aiohttp
import pytest
from telegram import Bot

from tests.fakebotapi import DEFAULT_FORUM_CHAT_ID as CHAT_ID, FakeBotApi
from tests.integration.leader_env import TOKEN
from topicbus.core.telegram import CallOutcome, DownloadInterrupted
from topicbus.bot.gateway import DOWNLOAD_CHUNK_BYTES, TelegramGateway, describe_download_error


@pytest.fixture
async def gateway(fake: FakeBotApi) -> AsyncIterator[TelegramGateway]:
    async with Bot(TOKEN, base_url=fake.base_url, base_file_url=fake.base_file_url) as bot:
        yield TelegramGateway(bot)


def document(fake: FakeBotApi, file_id: str, content: bytes) -> None:
    fake.push_message(CHAT_ID, None, document={"file_id": file_id, "file_name": "f.bin", "content": content})


async def test_a_file_streams_in_bounded_chunks_with_the_size_telegram_announced(fake: FakeBotApi,
                                                                                gateway: TelegramGateway):
    content = os.urandom(3 * 1024 * 1024 + 17)
    document(fake, "DOC_3mb", content)
    async with gateway.open_download("DOC_3mb") as result:
        assert result.outcome is CallOutcome.OK
        stream = result.value
        assert stream.size == len(content)
        chunks = [chunk async for chunk in stream.chunks()]
    assert b"".join(chunks) == content
    assert len(chunks) > 1 and max(len(c) for c in chunks) <= DOWNLOAD_CHUNK_BYTES


async def test_a_file_telegram_refuses_is_rejected_before_any_byte(fake: FakeBotApi, gateway: TelegramGateway):
    fake.push_media(CHAT_ID, "video", size=25 * 1024 * 1024, file_id="VID_big")
    async with gateway.open_download("VID_big") as too_big:
        assert (too_big.outcome, too_big.message, too_big.value) == (CallOutcome.REJECTED, "File is too big", None)
    async with gateway.open_download("NO_such_file") as unknown:
        assert unknown.outcome is CallOutcome.REJECTED and unknown.value is None


async def test_a_file_that_breaks_off_is_an_interrupted_download_that_names_no_token(fake: FakeBotApi,
                                                                                     gateway: TelegramGateway):
    content = os.urandom(1024 * 1024)
    document(fake, "DOC_cut", content)
    fake.cut_file("DOC_cut", 200_000)
    received = 0
    with pytest.raises(DownloadInterrupted) as interrupted:
        async with gateway.open_download("DOC_cut") as result:
            assert result.ok and result.value.size == len(content)
            async for chunk in result.value.chunks():
                received += len(chunk)
    assert received < len(content)
    assert TOKEN not in str(interrupted.value) and TOKEN.split(":")[1] not in str(interrupted.value)


def test_a_download_error_is_described_without_the_token_of_its_url():
    url = f"https://api.telegram.org/file/bot{TOKEN}/documents/file_7.pdf"
    text = describe_download_error(aiohttp.InvalidURL(url))
    assert TOKEN.split(":")[1] not in text and "/file/bot<token>/documents/file_7.pdf" in text
