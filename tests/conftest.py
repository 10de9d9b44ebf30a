"""Shared fixtures: a fresh fake Telegram Bot API server per test."""

from collections.abc import AsyncIterator

import pytest

from tests.fakebotapi import FakeBotApi


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotApi]:
    async with FakeBotApi() as server:
        yield server
