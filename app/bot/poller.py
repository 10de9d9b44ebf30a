"""Long polling that never loses an update.

PTB's ``Updater`` confirms a batch (advances the offset) before the handlers have run, so a crash
in between loses those updates. This poller hands each update of a ``getUpdates`` batch to
``Application.process_update`` inside the runtime's inbound batch (the routing handler queues owner
messages there), journals the whole batch durably in one transaction, and only then asks for the
next offset. A crash re-fetches unconfirmed updates; the journal drops them by ``update_id``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext

from loguru import logger
from telegram import Update
from telegram.error import Conflict, InvalidToken, NetworkError, RetryAfter, TimedOut
from telegram.ext import Application, CallbackContext

from topicbus.storage.db import AuthorityLost, StorageUnavailable

ALLOWED_UPDATES = ["message", "edited_message", "callback_query"]
MAX_HANDLER_ATTEMPTS = 3


class UpdatePoller:
    def __init__(self, app: Application, *, timeout_s: float, on_first_poll: Callable[[], None] | None = None,
                 batch: Callable[[float], AbstractAsyncContextManager[None]] | None = None):
        self._app = app
        self._batch = batch or (lambda received_at: nullcontext())
        self._timeout_s = timeout_s
        self._offset: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._on_first_poll = on_first_poll
        self.updates_seen = 0
        self.fatal: BaseException | None = None
        self._failed: dict[int, BaseException | None] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="update-poller")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()

    async def _run(self) -> None:
        backoff = 0.5
        first = True
        bot = self._app.bot
        while not self._stopping:
            try:
                # The first request does not wait, so "polling started" is known at once.
                timeout = 0 if first else self._timeout_s
                raw_updates = await bot.do_api_request(
                    "getUpdates", api_kwargs={"offset": self._offset, "timeout": timeout,
                                              "allowed_updates": ALLOWED_UPDATES},
                    read_timeout=timeout + 10)
            except InvalidToken as exc:
                self.fatal = exc
                logger.bind(phase="polling").error("Telegram rejected the bot token; polling stops")
                return
            except RetryAfter as exc:
                delay = exc.retry_after.total_seconds() if hasattr(exc.retry_after, "total_seconds") else exc.retry_after
                await asyncio.sleep(float(delay))
                continue
            except Conflict:
                logger.bind(phase="polling").warning("another getUpdates poller is active (409); backing off")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            except (TimedOut, NetworkError) as exc:
                logger.bind(phase="polling").warning("getUpdates failed ({}); retrying", type(exc).__name__)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            except Exception as exc:  # noqa: BLE001 - polling must never die on an odd answer
                logger.bind(phase="polling").warning("getUpdates answer unusable ({}); retrying",
                                                     type(exc).__name__)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.5
            if first:
                first = False
                if self._on_first_poll is not None:
                    self._on_first_poll()
            received_at = time.perf_counter()
            batch = raw_updates if isinstance(raw_updates, list) else []
            if not batch:
                continue
            try:
                async with self._batch(received_at):
                    next_offset = self._offset or 0
                    for raw in batch:
                        update_id = raw.get("update_id") if isinstance(raw, dict) else None
                        if not isinstance(update_id, int):
                            logger.bind(phase="polling").warning("skipped an update without an update_id")
                            continue
                        update = self._parse(raw)
                        if update is not None and not await self._process(update):
                            return
                        next_offset = max(next_offset, update_id + 1)
                        self.updates_seen += 1
            except AuthorityLost:
                logger.bind(phase="polling").warning("leader lease lost; polling stops without confirming")
                return
            except StorageUnavailable as exc:
                # Nothing of this batch is confirmed: the same updates are fetched again.
                logger.bind(phase="polling").warning("batch not journaled ({}); fetching it again", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            self._offset = next_offset

    def _parse(self, raw: dict) -> Update | None:
        """One update at a time, so a malformed update is skipped instead of stalling the batch."""
        try:
            return Update.de_json(raw, self._app.bot)
        except Exception as exc:  # noqa: BLE001 - malformed input is logged and confirmed away
            logger.bind(phase="polling").warning("skipped malformed update {} ({})", raw.get("update_id"),
                                                 type(exc).__name__)
            return None

    async def handler_error(self, update: object, context: CallbackContext) -> None:
        """Application error handler: remember which update failed so ``_process`` retries it."""
        if isinstance(update, Update):
            self._failed[update.update_id] = context.error

    async def _process(self, update: Update) -> bool:
        """Run the handlers. Storage trouble retries the same update (the offset is not advanced);
        any other handler failure is retried a few times, then logged and skipped so polling never wedges."""
        attempt = 0
        while not self._stopping:
            await self._app.process_update(update)
            error = self._failed.pop(update.update_id, None)
            if error is None:
                return True
            if isinstance(error, AuthorityLost):
                logger.bind(phase="polling").warning("leader lease lost; polling stops without confirming")
                self._stopping = True
                return False
            attempt += 1
            transient = isinstance(error, StorageUnavailable)
            if not transient and attempt >= MAX_HANDLER_ATTEMPTS:
                logger.bind(phase="polling").error("update {} skipped after {} failed attempts ({})",
                                                   update.update_id, attempt, type(error).__name__)
                return True
            logger.bind(phase="polling").warning("update {} not processed ({}); retrying",
                                                 update.update_id, type(error).__name__)
            await asyncio.sleep(min(0.2 * 2 ** attempt, 5.0))
        return False
