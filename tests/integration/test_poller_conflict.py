"""409 Conflict on getUpdates: a lasting conflict while this process holds its lease is reported
once, as an ERROR that says another process polls the same token and how to find it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from loguru import logger
from telegram.ext import Application, ApplicationBuilder

from topicbus.bot.poller import ANOTHER_POLLER, CONFLICTS_TO_PERSIST, WEBHOOK_SET, UpdatePoller
from tests.fakebotapi import FakeBotApi

TOKEN = "123456:TEST-conflict-token-0000000000000000"
WEBHOOK_CONFLICT = "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"


@pytest.fixture
async def app(fake: FakeBotApi) -> AsyncIterator[Application]:
    application = ApplicationBuilder().token(TOKEN).base_url(fake.base_url).updater(None).build()
    await application.initialize()
    yield application
    await application.shutdown()


@pytest.fixture
def errors() -> AsyncIterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda message: lines.append(message.record["message"]), level="ERROR")
    yield lines
    logger.remove(sink)


async def poll_through_conflicts(fake: FakeBotApi, app: Application, *, conflicts: int, holds_lease: bool = True,
                                 description: str | None = None) -> UpdatePoller:
    fake.fail_next("getUpdates", status=409, times=conflicts, description=description)
    poller = UpdatePoller(app, timeout_s=0.2, holds_lease=lambda: holds_lease)
    poller.start()
    try:
        # polling goes on after the conflicts: a successful poll follows them
        await fake.wait_for(lambda: [c.status for c in fake.calls_to("getUpdates")][conflicts:conflicts + 1] == [200],
                            timeout=30, message="a poll after the conflicts")
    finally:
        await poller.stop()
    return poller


async def test_a_lasting_conflict_is_reported_once_as_another_poller(fake: FakeBotApi, app: Application, errors):
    poller = await poll_through_conflicts(fake, app, conflicts=CONFLICTS_TO_PERSIST)
    assert poller.conflicts == CONFLICTS_TO_PERSIST
    assert errors == [ANOTHER_POLLER]
    assert "another process polls the same bot token" in ANOTHER_POLLER and "TOPICBUS_DB_PATH" in ANOTHER_POLLER


async def test_a_passing_conflict_is_only_a_warning(fake: FakeBotApi, app: Application, errors):
    await poll_through_conflicts(fake, app, conflicts=CONFLICTS_TO_PERSIST - 1)
    assert errors == []


async def test_no_verdict_about_other_pollers_without_the_lease(fake: FakeBotApi, app: Application, errors):
    await poll_through_conflicts(fake, app, conflicts=CONFLICTS_TO_PERSIST, holds_lease=False)
    assert errors == []


async def test_a_webhook_conflict_says_to_delete_the_webhook(fake: FakeBotApi, app: Application, errors):
    await poll_through_conflicts(fake, app, conflicts=1, description=WEBHOOK_CONFLICT)
    assert errors == [WEBHOOK_SET]
