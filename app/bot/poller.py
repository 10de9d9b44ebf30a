"""Long polling that never loses an update.

PTB's ``Updater`` confirms a batch (advances the offset) before the handlers have run, so a crash
in between loses those updates. This poller hands each update of a ``getUpdates`` batch to
``Application.process_update`` inside the runtime's inbound batch (the routing handler queues owner
messages there), journals the whole batch durably in one transaction, and only then asks for the
next offset. A crash re-fetches unconfirmed updates; the journal drops them by ``update_id``.

Per update: a malformed one is logged and confirmed away (updates are parsed one by one, so it
cannot take the batch with it); a handler failure is retried a few times, then logged and skipped
so polling never wedges; storage trouble retries the same update, and trouble journaling the batch
fetches the same batch again. The poller learns of handler failures through its own error handler
on the Application.
"""

from __future__ import annotations

import asyncio
import re
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

from loguru import logger
from telegram import Update
from telegram.error import Conflict, EndPointNotFound, InvalidToken, NetworkError, RetryAfter
from telegram.ext import Application, CallbackContext
from telegram.warnings import PTBUserWarning

from topicbus.bot.gateway import retry_after_seconds
from topicbus.retry import Backoff
from topicbus.core.authority import AuthorityLost
from topicbus.storage.db import StorageUnavailable

ALLOWED_UPDATES = ["message", "edited_message", "callback_query"]
MAX_HANDLER_ATTEMPTS = 3
CONFLICTS_TO_PERSIST = 3  # this many 409s…
CONFLICT_WINDOW_S = 60.0  # …within this time, while this leader holds its lease: another poller is at work
ANOTHER_POLLER = (
    "409 Conflict keeps coming while this leader holds the lease of its database: another process polls "
    "the same bot token. It is not a standby of this database (a standby waits, it does not poll): it is a "
    "topicbus leader with a different TOPICBUS_DB_PATH, an old deployment, or another bot program. Find it "
    "on every machine that has this token (`ps -ef | grep 'topicbus leader'`, `docker ps`) and stop it, or "
    "give one of them its own bot from @BotFather; until then the two split the updates")
WEBHOOK_SET = (
    "409 Conflict: a webhook is set for this bot token, and Telegram refuses getUpdates while it is. "
    "Remove it once with https://api.telegram.org/bot<TOKEN>/deleteWebhook (and stop whatever set it)")

# ``Bot.get_updates`` parses the whole batch at once (``Update.de_list``): one malformed update
# would fail the batch, and PTB then logs the raw batch at CRITICAL. So the poller asks with
# ``do_api_request`` and parses each update itself. PTB warns about exactly that call; the filter
# below ignores that one message, attributed to this module, and nothing else.
_DO_API_REQUEST_WARNING: dict[str, Any] = dict(
    action="ignore", category=PTBUserWarning, module=re.escape(__name__) + "$",
    message=re.escape("Please use 'Bot.getUpdates' instead of 'Bot.do_api_request(\"getUpdates\", ...)'"))


class UpdatePoller:
    def __init__(self, app: Application, *, timeout_s: float, on_first_poll: Callable[[], None] | None = None,
                 batch: Callable[[float], AbstractAsyncContextManager[None]] | None = None,
                 holds_lease: Callable[[], bool] = lambda: True):
        self._app = app
        self._batch = batch or (lambda received_at: nullcontext())
        self._timeout_s = timeout_s
        self._offset: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._on_first_poll = on_first_poll
        self.updates_seen = 0
        self.last_cycle_at = time.monotonic()  # when a getUpdates answer was last fully handled (health)
        self.fatal: BaseException | None = None
        self._failed: dict[int, BaseException | None] = {}
        self._holds_lease = holds_lease
        self._conflicts: list[float] = []  # monotonic times of recent 409s
        self._conflict_reported = False
        self.conflicts = 0
        app.add_error_handler(self.handler_error)

    def start(self) -> None:
        warnings.filterwarnings(**_DO_API_REQUEST_WARNING)  # idempotent: an equal filter is replaced
        self.last_cycle_at = time.monotonic()
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

    async def handler_error(self, update: object, context: CallbackContext) -> None:
        """The Application's error handler: remember which update failed so ``_process`` retries it.
        A handler running in the background (``block=False``, ``context.coroutine`` set) is no part of
        processing the update: its failure is logged by the leader's own error handler, and never
        makes the poller run the update again."""
        if isinstance(update, Update) and context.coroutine is None:
            self._failed[update.update_id] = context.error

    async def _run(self) -> None:
        backoff = Backoff(initial=0.5, maximum=10.0)
        first = True
        while not self._stopping:
            # The first request does not wait, so "polling started" is known at once.
            raw_updates = await self._fetch(0 if first else self._timeout_s, backoff)
            if self.fatal is not None:
                return
            if raw_updates is None:
                continue
            backoff.reset()
            if first:
                first = False
                if self._on_first_poll is not None:
                    self._on_first_poll()
            if not raw_updates:
                self.last_cycle_at = time.monotonic()
                continue
            try:
                next_offset = await self._handle_batch(raw_updates, time.perf_counter())
            except AuthorityLost:
                logger.bind(phase="polling").warning("leader lease lost; polling stops without confirming")
                return
            except StorageUnavailable as exc:
                # Nothing of this batch is confirmed: the same updates are fetched again.
                logger.bind(phase="polling").warning("batch not journaled ({}); fetching it again", exc)
                await backoff.sleep()
                continue
            if next_offset is None:
                return
            self._offset = next_offset
            self.last_cycle_at = time.monotonic()
            # The batch queued its delivery frames for the followers' writer tasks: let them write
            # before the next getUpdates is built (about 0.5 ms of PTB and httpx that a frame would
            # otherwise wait behind).
            await asyncio.sleep(0)

    async def _fetch(self, timeout: float, backoff: Backoff) -> list[Any] | None:
        """One ``getUpdates``; ``None`` after a failure (already waited for), or with ``fatal`` set."""
        try:
            raw_updates = await self._app.bot.do_api_request(
                "getUpdates", api_kwargs={"offset": self._offset, "timeout": timeout,
                                          "allowed_updates": ALLOWED_UPDATES},
                read_timeout=timeout + 10)
        except (InvalidToken, EndPointNotFound) as exc:
            # do_api_request reports a rejected token (401/404) as EndPointNotFound once the bot is
            # initialised; getUpdates exists, so either way the token is no longer accepted.
            self.fatal = exc
            logger.bind(phase="polling").error("Telegram rejected the bot token; polling stops")
            return None
        except RetryAfter as exc:
            await asyncio.sleep(retry_after_seconds(exc))
            return None
        except Conflict as exc:
            self._conflict(exc)
        except NetworkError as exc:  # TimedOut included
            logger.bind(phase="polling").warning("getUpdates failed ({}); retrying", type(exc).__name__)
        except Exception as exc:  # noqa: BLE001 - polling must never die on an odd answer
            logger.bind(phase="polling").warning("getUpdates answer unusable ({}); retrying", type(exc).__name__)
        else:
            return raw_updates if isinstance(raw_updates, list) else []
        await backoff.sleep()
        return None

    def _conflict(self, exc: Conflict) -> None:
        """A 409: one WARNING for the first; when they persist while this process holds the lease,
        one ERROR that says what it means and how to find the other poller (once per streak: a
        streak ends after a window without 409s)."""
        self.conflicts += 1
        now = time.monotonic()
        if self._conflicts and now - self._conflicts[-1] > CONFLICT_WINDOW_S:
            self._conflicts.clear()
            self._conflict_reported = False
        self._conflicts = [t for t in self._conflicts if now - t <= CONFLICT_WINDOW_S] + [now]
        log = logger.bind(phase="polling")
        if "webhook" in exc.message.lower():
            if not self._conflict_reported:
                log.error(WEBHOOK_SET)
                self._conflict_reported = True
            return
        if len(self._conflicts) == 1:
            log.warning("another getUpdates poller is active (409); backing off")
        elif (len(self._conflicts) >= CONFLICTS_TO_PERSIST and not self._conflict_reported
              and self._holds_lease()):
            log.error(ANOTHER_POLLER)
            self._conflict_reported = True
        else:
            log.debug("409 Conflict again ({} in the last {:.0f}s)", len(self._conflicts), CONFLICT_WINDOW_S)

    async def _handle_batch(self, raw_updates: list[Any], received_at: float) -> int | None:
        """Process every update inside one inbound batch; the offset to confirm once it is journaled,
        or ``None`` when the poller has to stop without confirming."""
        async with self._batch(received_at):
            next_offset = self._offset or 0
            for raw in raw_updates:
                update_id = raw.get("update_id") if isinstance(raw, dict) else None
                if not isinstance(update_id, int):
                    logger.bind(phase="polling").warning("skipped an update without an update_id")
                    continue
                update = self._parse(raw)
                if update is not None and not await self._process(update):
                    return None
                next_offset = max(next_offset, update_id + 1)
                self.updates_seen += 1
        return next_offset

    def _parse(self, raw: dict) -> Update | None:
        """One update at a time, so a malformed update is skipped instead of stalling the batch."""
        try:
            return Update.de_json(raw, self._app.bot)
        except Exception as exc:  # noqa: BLE001 - malformed input is logged and confirmed away
            logger.bind(phase="polling").warning("skipped malformed update {} ({})", raw.get("update_id"),
                                                 type(exc).__name__)
            return None

    async def _process(self, update: Update) -> bool:
        """Run the handlers. Storage trouble retries the same update (the offset is not advanced);
        any other handler failure is retried a few times, then logged and skipped so polling never wedges."""
        backoff, failures = Backoff(initial=0.4, maximum=5.0), 0
        while not self._stopping:
            await self._app.process_update(update)
            error = self._failed.pop(update.update_id, None)
            if error is None:
                return True
            if isinstance(error, AuthorityLost):
                logger.bind(phase="polling").warning("leader lease lost; polling stops without confirming")
                self._stopping = True
                return False
            failures += 1
            if not isinstance(error, StorageUnavailable) and failures >= MAX_HANDLER_ATTEMPTS:
                logger.bind(phase="polling").error("update {} skipped after {} failed attempts ({})",
                                                   update.update_id, failures, type(error).__name__)
                return True
            logger.bind(phase="polling").warning("update {} not processed ({}); retrying",
                                                 update.update_id, type(error).__name__)
            await backoff.sleep()
        return False
