"""The ``fake`` fixture: a fresh fake Telegram Bot API server per test (``tests/fakebotapi.py``).

A pytest plugin module for the layers that talk to Telegram: ``tests/integration/conftest.py`` and
``tests/e2e/conftest.py`` import it. Unit tests never load it (nor aiohttp's server with it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakebotapi import FakeBotApi


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeBotApi]:
    # PTB in this process hands durations as `topicbus leader` makes it (PTB_TIMEDELTA, cli.cmd_leader).
    monkeypatch.setenv("PTB_TIMEDELTA", "true")
    async with FakeBotApi() as server:
        yield server
