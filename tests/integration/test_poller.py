"""topicbus.bot.poller against the fake Bot API with a real PTB Application: an update is confirmed
(the offset advanced) only after its batch is journaled; malformed updates are skipped; handler
failures are retried, then skipped; storage trouble is retried without confirming; no PTB warning."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from loguru import logger
from telegram import Update
from telegram.ext import Application, ApplicationBuilder, ContextTypes, MessageHandler, filters
from telegram.warnings import PTBUserWarning

from topicbus.bot.poller import MAX_HANDLER_ATTEMPTS, UpdatePoller
from topicbus.core.authority import AuthorityLost
from topicbus.storage.db import StorageUnavailable
from tests.fakebotapi import FakeBotApi

TOKEN = "123456:TEST-poller-token-00000000000000000"
CHAT = -1001234567890


class Journal:
    """The inbound batch port: what the handlers saw is committed when the batch closes, unless
    ``fail_with`` is set (then the batch raises, as the real journal does on a storage error)."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        self.committed: list[str] = []
        self.fail_with: list[BaseException] = []
        self.gate: asyncio.Event | None = None  # when set, commits wait for it
        self.at_gate = asyncio.Event()

    @asynccontextmanager
    async def batch(self, received_at: float) -> AsyncIterator[None]:
        self.pending = []
        yield
        if self.gate is not None:
            self.at_gate.set()
            await self.gate.wait()
        if self.fail_with:
            raise self.fail_with.pop(0)
        self.committed.extend(self.pending)


@pytest.fixture
async def app(fake: FakeBotApi) -> AsyncIterator[Application]:
    application = ApplicationBuilder().token(TOKEN).base_url(fake.base_url).updater(None).build()
    await application.initialize()
    yield application
    await application.shutdown()


@asynccontextmanager
async def polling(app: Application, journal: Journal,
                  handler: Callable[[Update, ContextTypes.DEFAULT_TYPE], object]) -> AsyncIterator[UpdatePoller]:
    app.add_handler(MessageHandler(filters.ALL, handler))
    poller = UpdatePoller(app, timeout_s=1, batch=journal.batch)
    poller.start()
    try:
        yield poller
    finally:
        await poller.stop()


def recorder(journal: Journal, seen: list[str], fail: Callable[[str], BaseException | None] = lambda text: None):
    async def handle(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        text = update.message.text if update.message else ""
        seen.append(text)
        if (error := fail(text)) is not None:
            raise error
        journal.pending.append(text)
    return handle


async def test_updates_are_confirmed_only_after_their_batch_is_journaled(fake: FakeBotApi, app: Application):
    journal, seen = Journal(), []
    journal.gate = asyncio.Event()
    async with polling(app, journal, recorder(journal, seen)):
        update = fake.push_message(CHAT, "one")
        await asyncio.wait_for(journal.at_gate.wait(), 10)  # the poller is parked inside the journal step
        assert seen == ["one"] and journal.committed == []
        assert fake.pending_updates() == [update]  # not confirmed: a crash now would fetch it again
        assert all(c.params.get("offset") in (None, 0) for c in fake.calls_to("getUpdates"))
        journal.gate.set()
        await fake.wait_for(lambda: not fake.pending_updates(), message="confirmed after the journal")
        assert journal.committed == ["one"]
        offsets = [c.params.get("offset") for c in fake.calls_to("getUpdates")]
        assert offsets[-1] == update["update_id"] + 1


async def test_a_batch_that_cannot_be_journaled_is_fetched_and_processed_again(fake: FakeBotApi, app: Application):
    journal, seen = Journal(), []
    journal.fail_with = [StorageUnavailable("database is locked")]
    async with polling(app, journal, recorder(journal, seen)):
        fake.push_message(CHAT, "again")
        await fake.wait_for(lambda: journal.committed == ["again"], message="journaled on the second try")
        await fake.wait_for(lambda: not fake.pending_updates(), message="confirmed")
        assert seen == ["again", "again"]  # handled twice, journaled once (the real journal dedups by id)


async def test_a_malformed_update_is_skipped_and_confirmed_and_the_batch_goes_on(fake: FakeBotApi, app: Application):
    journal, seen, lines = Journal(), [], []
    sink = logger.add(lambda message: lines.append(str(message)), level="WARNING")
    try:
        fake.push_message(CHAT, "before")
        bad = fake.push_update({"message": {"message_id": 5, "chat": {"id": CHAT}}})  # no date, no chat type
        fake.push_message(CHAT, "after")
        async with polling(app, journal, recorder(journal, seen)):
            await fake.wait_for(lambda: not fake.pending_updates(), message="all three confirmed")
    finally:
        logger.remove(sink)
    assert seen == ["before", "after"] and journal.committed == ["before", "after"]
    assert any(f"skipped malformed update {bad['update_id']}" in line for line in lines), lines


async def test_a_failing_handler_is_retried_then_skipped(fake: FakeBotApi, app: Application):
    journal, seen = Journal(), []
    handler = recorder(journal, seen, fail=lambda text: ValueError("boom") if text == "poison" else None)
    async with polling(app, journal, handler):
        fake.push_message(CHAT, "poison")
        fake.push_message(CHAT, "next")
        await fake.wait_for(lambda: journal.committed == ["next"], timeout=15, message="the next update")
        await fake.wait_for(lambda: not fake.pending_updates(), message="both confirmed")
    assert seen == ["poison"] * MAX_HANDLER_ATTEMPTS + ["next"]


async def test_a_background_handler_that_fails_never_makes_the_update_run_again(fake: FakeBotApi, app: Application):
    """A ``block=False`` handler (the control topic's /mode and /forget) runs beside the poll loop:
    its failure is logged by the other error handlers, and the update is not processed again, even
    when the failure comes while the update's other handlers still run."""
    journal, seen, background = Journal(), [], []
    failure_seen = asyncio.Event()

    async def fails_in_the_background(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        background.append(update.update_id)
        raise ValueError("a background command failed")

    async def still_running(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await failure_seen.wait()  # the update is still being processed when the failure is reported
        await recorder(journal, seen)(update, context)

    async def after_the_pollers(update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        failure_seen.set()

    app.add_handler(MessageHandler(filters.ALL, fails_in_the_background, block=False), group=-1)
    await app.start()
    try:
        async with polling(app, journal, still_running):
            app.add_error_handler(after_the_pollers)  # after the poller's own: it has seen the failure
            update = fake.push_message(CHAT, "once")
            await fake.wait_for(lambda: not fake.pending_updates(), message="confirmed")
    finally:
        await app.stop()
    assert background == [update["update_id"]] and seen == ["once"] and journal.committed == ["once"]


async def test_storage_trouble_in_a_handler_is_retried_until_it_passes(fake: FakeBotApi, app: Application):
    journal, seen = Journal(), []
    failures = [StorageUnavailable("database is locked")] * MAX_HANDLER_ATTEMPTS  # another error would be skipped
    handler = recorder(journal, seen, fail=lambda text: failures.pop() if failures else None)
    async with polling(app, journal, handler):
        fake.push_message(CHAT, "durable")
        await fake.wait_for(lambda: journal.committed == ["durable"], timeout=20, message="processed in the end")
        await fake.wait_for(lambda: not fake.pending_updates(), message="confirmed")
    assert seen == ["durable"] * (MAX_HANDLER_ATTEMPTS + 1)  # never skipped


async def test_a_lost_lease_stops_polling_without_confirming(fake: FakeBotApi, app: Application):
    journal, seen = Journal(), []
    journal.fail_with = [AuthorityLost("lease lost")]
    async with polling(app, journal, recorder(journal, seen)) as poller:
        update = fake.push_message(CHAT, "unconfirmed")
        await fake.wait_for(lambda: poller.done, message="poller stopped")
        assert fake.pending_updates() == [update] and poller.fatal is None


async def test_flood_control_and_conflicts_on_get_updates_are_waited_out(fake: FakeBotApi, app: Application):
    journal, seen = Journal(), []
    fake.fail_next("getUpdates", status=429, retry_after=1)
    fake.fail_next("getUpdates", status=409)
    async with polling(app, journal, recorder(journal, seen)):
        fake.push_message(CHAT, "through")
        await fake.wait_for(lambda: journal.committed == ["through"], message="polling resumed")
    assert [c.status for c in fake.calls_to("getUpdates")][:2] == [429, 409]


async def test_a_rejected_token_is_fatal(fake: FakeBotApi, app: Application):
    fake.fail_next("getUpdates", status=401)
    async with polling(app, Journal(), recorder(Journal(), [])) as poller:
        await fake.wait_for(lambda: poller.done, message="poller stopped")
    assert type(poller.fatal).__name__ in ("InvalidToken", "EndPointNotFound")  # PTB's name for it after getMe


async def test_polling_raises_no_ptb_warning_while_other_calls_still_warn(fake: FakeBotApi, app: Application):
    journal, seen = Journal(), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with polling(app, journal, recorder(journal, seen)):
            fake.push_message(CHAT, "quiet")
            await fake.wait_for(lambda: journal.committed == ["quiet"], message="polled")
            await fake.wait_for(lambda: len(fake.calls_to("getUpdates")) >= 3, message="a few polls")
        await app.bot.do_api_request("getMe")  # the same PTB warning from another caller is not hidden
    ptb = [str(w.message) for w in caught if issubclass(w.category, PTBUserWarning)]
    assert ptb == ["Please use 'Bot.getMe' instead of 'Bot.do_api_request(\"getMe\", ...)'"], ptb
