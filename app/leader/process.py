"""``topicbus leader``: lease election, one leadership term after another, graceful stop.

:class:`LeaderProcess` holds the process-wide pieces (store, HTTP/bus server) and loops: wait as
standby until the lease is ours, lead until stopped or the lease is lost, repeat.
:class:`Leadership` runs one term: the PTB ``Application``, the term's parts (a ``RunningTerm``), the poller — started
in that order and stopped in reverse.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
import os
import socket
import uuid
from typing import Any

from loguru import logger
from telegram.error import InvalidToken, NetworkError, TimedOut
from telegram.ext import Application, ContextTypes, JobQueue

from topicbus import __version__
from topicbus.bot.chat_check import check_chat, setup_fix
from topicbus.core.telegram import CallResult
from topicbus.bot.gateway import TelegramGateway, redact_bot_urls
from topicbus.bot.menu import MenuSync, sync_command_menu
from topicbus.bot.application import ApplicationUnavailable, build_application
from topicbus.bot.poller import UpdatePoller
from topicbus.bot.timers import JobQueueTimers, RunningJobs
from topicbus.bus import metrics
from topicbus.bus.metrics import Snapshot
from topicbus.bus.server import BusLimits, BusServer, TlsConfigurationError, tls_context
from topicbus.core.clock import Clock, SystemClock
from topicbus.host import ProcessLiveness, current_host_id
from topicbus.core.budget import BudgetConfig
from topicbus.core.output import EDIT_INTERVAL_MS, OutputConfig
from topicbus.core.status import StatusReport
from topicbus.leader.assembly import RunningTerm
from topicbus.leader.health import LeaderHealth
from topicbus.leader.notices import restart_text, welcome_text
from topicbus.leader.outbound import OutboundOptions
from topicbus.leader.provisioning import SlotUnavailable, TopicCreationFailed
from topicbus.leader.rotation import RotationBlocked
from topicbus.leader.term import LeaderTerm
from topicbus.leader.transcription import TranscriptionOptions
from topicbus.logsetup import EventJournal
from topicbus.retry import Backoff, sleep_or_stop
from topicbus.settings import Settings
from topicbus.speech.client import TranscriptionEndpoint
from topicbus.core.admission import AdmissionBlocked
from topicbus.core.authority import Authority
from topicbus.storage.db import Database, StorageUnavailable
from topicbus.storage.lease import LeaseRepository

STANDBY_POLL_S = 0.5
PRUNE_JOB_ID = "topicbus.prune"
LEASE_JOB_ID = "topicbus.lease"
PURGE_JOB_ID = "topicbus.purge"
PURGE_INTERVAL_S = 3600
HEAP_FREEZE_JOB_ID = "topicbus.heap-freeze"
HEAP_FREEZE_AFTER_S = 1.0  # after readiness: a full collection takes about 20 ms, which /healthz need not wait for
JOBS_SETTLE_S = 5.0  # a stop waits this long for running jobs (a lease refresh, a prune pass) to end
HISTORY_KEEP_MS = 7 * 24 * 3600 * 1000  # delivered/sent rows are kept a week for diagnosis


def outbound_options(s: Settings) -> OutboundOptions:
    """The chat's budget and the shape of output, from the environment."""
    budget = BudgetConfig.for_chat(s.chat_id or 0, per_minute=s.rate_limit_per_chat_per_minute,
                                   per_second=s.rate_limit_per_chat_per_second, reserve=s.budget_reserve,
                                   overall_per_second=s.rate_limit_per_second, window_s=s.rate_limit_window_s)
    # A live message is edited at most every 4 s of a 60 s window: it scales with the window, so a
    # compressed window (the budget benchmark) compresses it too.
    output = OutputConfig(file_threshold=s.output_file_threshold, live_window_ms=int(s.live_message_s * 1000),
                          edit_interval_ms=int(EDIT_INTERVAL_MS * s.rate_limit_window_s / 60),
                          quiet_ms=int(s.stream_quiet_s * 1000), coalesce=s.output_coalesce)
    return OutboundOptions(budget=budget, output=output, max_items=s.outbox_max_items, max_bytes=s.outbox_max_bytes)


class FatalLeaderError(Exception):
    """The leader cannot run with this configuration (e.g. Telegram rejects the token)."""


class LeaderProcess:
    def __init__(self, settings: Settings, *, clock: Clock | None = None):
        self.settings = settings
        self.clock = clock or SystemClock()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.events = EventJournal()
        self.leadership: Leadership | None = None
        self.health = LeaderHealth(poll_deadline_s=settings.health_poll_deadline_s,
                                   lease_stale_after_ms=settings.lease_stale_after_ms,
                                   poll_timeout_s=settings.poll_timeout_s)
        try:
            tls = (tls_context(settings.bus_tls_cert, settings.bus_tls_key)
                   if settings.bus_tls_cert and settings.bus_tls_key else None)  # settings: both or neither
        except TlsConfigurationError as exc:
            raise FatalLeaderError(f"TOPICBUS_BUS_TLS_CERT/TOPICBUS_BUS_TLS_KEY: {exc}") from None
        self.server = BusServer(
            host=settings.bus_host, port=settings.bus_port,
            secret=settings.bus_secret.get_secret_value() if settings.bus_secret else None,
            status=self._status, metrics=self._metrics, limits=BusLimits.from_settings(settings), ssl_context=tls,
            health=self._health_reasons)

    async def run(self, stop: asyncio.Event) -> int:
        if self.settings.bus_secret is None or not self.settings.bus_secret.get_secret_value():
            logger.bind(phase="startup").warning(
                "TOPICBUS_BUS_SECRET is not set: the bus refuses every follower until it is configured")
        db = await Database.open(self.settings.db_path, synchronous=self.settings.db_synchronous)
        leases = LeaseRepository(db)
        bind_task = asyncio.create_task(self.server.start_with_retry(stop), name="bus-bind")
        authority: Authority | None = None
        announced = False
        try:
            while not stop.is_set():
                previous = await leases.current()
                authority = await leases.try_acquire(self.owner, self.clock.now_ms(),
                                                     self.settings.lease_stale_after_ms)
                if authority is None:
                    if self.server.role != "standby" or not announced:
                        logger.bind(phase="lease").info("another leader holds the lease; waiting as standby")
                        announced = True
                    self.server.role = "standby"
                    await sleep_or_stop(STANDBY_POLL_S, stop)
                    continue
                logger.bind(phase="lease").info("leader lease acquired (epoch {})", authority.epoch)
                term = LeaderTerm(self.owner)
                term.begin(authority)
                # A predecessor that stopped cleanly released the lease (heartbeat 0); one that
                # crashed, was killed or lost its lease left its last heartbeat behind.
                unclean = (previous is not None and previous.heartbeat_at_ms != 0
                           and previous.epoch + 1 == authority.epoch)
                self.leadership = Leadership(self.settings, term, self.server, leases, db=db, clock=self.clock,
                                             events=self.events, after_unclean_stop=unclean, health=self.health)
                lost = await self.leadership.run(stop)
                self.leadership = None
                if lost:
                    logger.bind(phase="lease").warning("leader lease lost; returning to standby")
                    authority = None
            return 0
        finally:
            if authority is not None:
                try:
                    await leases.release(authority)
                except Exception:  # noqa: BLE001 - the lease simply expires
                    pass
            bind_task.cancel()
            await asyncio.gather(bind_task, return_exceptions=True)
            await self.server.stop()
            await db.close()

    async def _status(self) -> StatusReport:
        running = self.leadership.running if self.leadership is not None else None
        if running is not None:
            return await running.status(self.server.role)
        return StatusReport(role=self.server.role, epoch=self.server.epoch)

    def _health_reasons(self) -> list[str]:
        return self.health.reasons() if self.leadership is not None else []

    def _metrics(self) -> Snapshot:
        leadership = self.leadership
        running = leadership.running if leadership else None
        values: dict[metrics.MetricSpec, Any] = {
            metrics.LEADER: 1 if self.server.role == "leader" else 0,
            metrics.EPOCH: self.server.epoch,
            metrics.FOLLOWERS: 0,
            metrics.DOWNLOADS_ACTIVE: self.server.downloads.active,
            metrics.DOWNLOADS_WAITING: self.server.downloads.waiting,
        }
        if running is not None and leadership is not None:
            values.update(running.metrics())
            values[metrics.UPDATES_SEEN_TOTAL] = leadership.poller.updates_seen if leadership.poller else 0
        return values


def transcription_options(s: Settings) -> TranscriptionOptions:
    """Voice notes as text, from the environment (no endpoint: they stay files)."""
    endpoint = None if s.transcribe_url is None else TranscriptionEndpoint(
        base_url=s.transcribe_url, model=s.transcribe_model, language=s.transcribe_language, key=s.transcribe_key)
    return TranscriptionOptions(endpoint=endpoint, max_s=s.transcribe_max_s, timeout_s=s.transcribe_timeout_s)


class ChatChecks:
    """Before a term opens: can TOPICBUS_CHAT_ID hold topics, and the group's command menu. These
    calls go to Telegram directly (no chat budget spent, and the scheduler has not started yet)."""

    def __init__(self, chat_id: int, telegram: TelegramGateway):
        self._chat_id = chat_id
        self._telegram = telegram

    async def run(self, bot_id: int) -> None:
        """The command menu is read while the chat is checked (one round trip to Telegram fewer
        before readiness), and set only once the chat passed: a wrong TOPICBUS_CHAT_ID changes
        nothing. Raises :class:`FatalLeaderError` with the fix when the chat cannot be used."""
        menu = asyncio.create_task(self._telegram.get_commands(self._chat_id), name="command-menu-read")
        try:
            await self._check_chat(bot_id)
        except BaseException:
            menu.cancel()
            await asyncio.gather(menu, return_exceptions=True)
            raise
        await self._sync_command_menu(await menu)

    async def _check_chat(self, bot_id: int) -> None:
        """A chat the bot cannot run topics in is a configuration error: exit 2 with the fix."""
        verdict = await check_chat(self._telegram, self._chat_id, bot_id)
        if verdict.fix is not None:
            raise FatalLeaderError(f"cannot use TOPICBUS_CHAT_ID {self._chat_id}: {verdict.fix}")
        if verdict.note is not None:
            logger.bind(phase="startup").warning("could not check the chat ({}); going on",
                                                 redact_bot_urls(verdict.note))

    async def _sync_command_menu(self, current: CallResult) -> None:
        """The group's command menu, set only when it differs from Telegram's (a failure is not fatal)."""
        outcome, detail = await sync_command_menu(self._telegram, self._chat_id, current=current)
        if outcome is MenuSync.FAILED:
            logger.bind(phase="startup").warning("command menu not set ({}); the commands still work", detail)
        elif outcome is MenuSync.SET:
            logger.bind(phase="startup").info("command menu set for the chat")


class TermJobs:
    """The term's periodic jobs on PTB's JobQueue: the lease refresh (from before the term opens),
    then pruning, the history purge and, once, the heap freeze."""

    def __init__(self, jq: JobQueue, settings: Settings, term: LeaderTerm, running: RunningTerm,
                 leases: LeaseRepository, clock: Clock, health: LeaderHealth, *, on_lost: Callable[[], None]):
        self._jq = jq
        self._settings = settings
        self._term = term
        self._running = running
        self._leases = leases
        self._clock = clock
        self._health = health
        self._on_lost = on_lost

    def start_lease_refresh(self) -> None:
        every = self._settings.lease_refresh_ms / 1000
        self._jq.run_repeating(self._refresh_lease, interval=every, first=every, name=LEASE_JOB_ID,
                               job_kwargs={"id": LEASE_JOB_ID, "replace_existing": True, "misfire_grace_time": None,
                                           "coalesce": True})

    def start_term_jobs(self) -> None:
        """Once the term is open and greeted."""
        every = self._settings.prune_interval_ms / 1000
        self._jq.run_repeating(self._prune, interval=every, first=every, name=PRUNE_JOB_ID,
                               job_kwargs={"id": PRUNE_JOB_ID, "replace_existing": True, "coalesce": True,
                                           "max_instances": 1, "misfire_grace_time": None})
        self._jq.run_repeating(self._purge, interval=PURGE_INTERVAL_S, first=60, name=PURGE_JOB_ID,
                               job_kwargs={"id": PURGE_JOB_ID, "replace_existing": True, "coalesce": True,
                                           "max_instances": 1})
        self._jq.run_once(self._freeze_heap, when=HEAP_FREEZE_AFTER_S, name=HEAP_FREEZE_JOB_ID,
                          job_kwargs={"id": HEAP_FREEZE_JOB_ID, "replace_existing": True, "misfire_grace_time": None})

    async def _freeze_heap(self, context: ContextTypes.DEFAULT_TYPE) -> None:
        """Everything the start built (PTB, handlers, the term's parts) lives as long as the term: keep
        it out of the cyclic collector's scans so collections on the routing path stay short. Run once,
        a moment after the start, so that readiness does not wait for the full collection before it."""
        gc.collect()
        gc.freeze()

    async def _refresh_lease(self, context: ContextTypes.DEFAULT_TYPE) -> None:
        authority = self._term.current()
        if authority is None:
            return
        try:
            still = await self._leases.refresh(authority, self._clock.now_ms())
        except Exception as exc:  # noqa: BLE001 - a busy database: try again next tick
            logger.bind(phase="lease").warning("lease refresh failed ({}); will retry", type(exc).__name__)
            self._health.lease_failed(f"{type(exc).__name__}: {exc}"[:200])
            return
        if not still:
            self._on_lost()
        else:
            self._health.lease_refreshed()

    async def _purge(self, context: ContextTypes.DEFAULT_TYPE) -> None:
        journal, outbox, keyboards = await self._running.purge_history(HISTORY_KEEP_MS, self._clock.now_ms())
        if journal or outbox:
            logger.bind(phase="purge").info("purged {} delivered messages and {} sent outputs", journal, outbox)
        if keyboards:
            logger.bind(phase="purge").info("purged {} inline keyboards", keyboards)

    async def _prune(self, context: ContextTypes.DEFAULT_TYPE) -> None:
        await self._running.prune()


class Leadership:
    """Everything that exists only while this process holds the lease."""

    def __init__(self, settings: Settings, term: LeaderTerm, server: BusServer, leases: LeaseRepository, *,
                 db: Database, clock: Clock, events: EventJournal, after_unclean_stop: bool = False,
                 health: LeaderHealth | None = None):
        self.settings = settings
        self.after_unclean_stop = after_unclean_stop
        self.health = health or LeaderHealth(poll_deadline_s=settings.health_poll_deadline_s,
                                             lease_stale_after_ms=settings.lease_stale_after_ms)
        self.term = term
        self.server = server
        self._db = db
        self._clock = clock
        self._events = events
        self.running: RunningTerm | None = None
        self.poller: UpdatePoller | None = None
        self._jobs: RunningJobs | None = None
        self.lost = asyncio.Event()
        self._leases = leases
        self._polled_once = False

    async def run(self, stop: asyncio.Event) -> bool:
        """Lead until ``stop`` or until the lease is lost; returns True when it was lost."""
        s = self.settings
        try:
            app = build_application(s)
        except ApplicationUnavailable as exc:
            raise FatalLeaderError(str(exc)) from None
        initialized = await self._initialize(app, stop)
        if not initialized or stop.is_set():
            if initialized:
                await app.shutdown()
            return self.lost.is_set()
        jq = app.job_queue
        assert jq is not None
        self._jobs = RunningJobs(jq)
        running = RunningTerm.assemble(
            self.term, db=self._db, bot=app.bot, clock=self._clock, events=self._events, chat_id=s.chat_id or 0,
            timers=JobQueueTimers(jq), liveness=ProcessLiveness(current_host_id()), default_cleanup=s.thread_cleanup,
            default_display_mode=s.display_mode, stale_after_ms=s.follower_stale_after_ms,
            outbound_options=outbound_options(s), offline_ttl_s=s.offline_ttl_s, receipt_reaction=s.receipt_reaction,
            cleanup_grace_s=s.cleanup_grace_s, transcription=transcription_options(s))
        self.running = running
        try:
            await ChatChecks(s.chat_id or 0, TelegramGateway(app.bot)).run(app.bot.id)
        except FatalLeaderError:
            await app.shutdown()
            raise
        self.poller = UpdatePoller(app, timeout_s=s.poll_timeout_s, on_first_poll=self._polling_started,
                                   batch=self._journaled_batch(running),
                                   holds_lease=lambda: self.term.current() is not None and not self.lost.is_set())
        self.health.begin_term(self.poller, running.receipts)
        running.register_handlers(app, chat_id=s.chat_id or 0, owner_ids=s.owner_ids)
        app.add_error_handler(self._handler_error)
        self.server.role, self.server.epoch = "starting", self.term.authority().epoch
        jobs = TermJobs(jq, s, self.term, running, self._leases, self._clock, self.health, on_lost=self._lose)
        await app.start()
        try:
            jobs.start_lease_refresh()
            if not await running.open(provision_control=lambda: self._provision_control_topic(stop)):
                return self.lost.is_set()
            await self._greet(running)
            jobs.start_term_jobs()
            self.server.publish(running.followers, self.term.authority().epoch)
            self.poller.start()
            await self._wait_until_done(stop)
        finally:
            await self._teardown(app, running)
        return self.lost.is_set()

    async def _greet(self, running: RunningTerm) -> None:
        """The control topic's first words: the welcome on a new database; later, one line when the
        previous leader did not stop cleanly (a clean restart says nothing)."""
        url = self.settings.bus_url(self.server.bound_port)
        secret = self.settings.bus_secret is not None and bool(self.settings.bus_secret.get_secret_value())
        try:
            if await running.notices.welcome(welcome_text(__version__, url, secret_set=secret)):
                logger.bind(phase="startup").info("welcome posted in the control topic (bus {})", url)
            elif self.after_unclean_stop:
                await running.notices.answer(restart_text(self.term.authority().epoch))
        except Exception as exc:  # noqa: BLE001 - a greeting is never worth a term (a lost lease shows up anyway)
            logger.bind(phase="startup").warning("control topic greeting not posted ({})", type(exc).__name__)

    async def _provision_control_topic(self, stop: asyncio.Event) -> bool:
        """The control topic is needed before followers are accepted; retry until Telegram allows it."""
        assert self.running is not None
        backoff = Backoff(initial=1.0, maximum=60.0)
        while not stop.is_set() and not self.lost.is_set():
            try:
                await self.running.provision_control_topic()
                return True
            except (TopicCreationFailed, SlotUnavailable, RotationBlocked, AdmissionBlocked) as exc:
                fix = setup_fix(str(exc), self.settings.chat_id or 0) if isinstance(exc, TopicCreationFailed) else None
                if fix is not None:
                    raise FatalLeaderError(f"cannot create the control topic: {fix}") from None
                delay = backoff.next()
                logger.bind(phase="leader-provision").error(
                    "cannot provision the control topic: {} — check that the bot is an admin with Manage Topics "
                    "in a forum chat; retrying in {:.0f}s", exc, delay)
            await _wait_any(stop, self.lost, delay)
        return False

    async def _initialize(self, app: Application, stop: asyncio.Event) -> bool:
        """``getMe`` until Telegram answers. The lease refresh job does not run yet, so the lease is
        refreshed here: a leader that waited past the stale window must not start polling."""
        backoff = Backoff(initial=0.5, maximum=15.0)
        while not stop.is_set():
            try:
                await app.initialize()
                return True
            except InvalidToken as exc:
                raise FatalLeaderError("Telegram rejected TOPICBUS_BOT_TOKEN (getMe failed)") from exc
            except (TimedOut, NetworkError) as exc:
                delay = backoff.next()
                logger.bind(phase="startup").warning(
                    "cannot reach Telegram at {}getMe ({}: {}); retrying in {:.1f}s. Check the network "
                    "(a proxy, a firewall) and TOPICBUS_API_BASE_URL", f"{self.settings.api_base_url}<token>/",
                    type(exc).__name__, redact_bot_urls(str(exc)), delay)
                await sleep_or_stop(delay, stop)
                if not await self._leases.refresh(self.term.authority(), self._clock.now_ms()):
                    self._lose()
                    return False
        return False

    def _polling_started(self) -> None:
        self.server.polling = True
        if self._polled_once:  # a restarted poller: the startup window is not opened again
            return
        self._polled_once = True
        if self.running is not None:
            self.running.startup.arm(self.settings.follower_stale_after_ms / 1000)
        logger.bind(phase="startup").info("polling Telegram as leader (epoch {})", self.term.epoch)

    async def _wait_until_done(self, stop: asyncio.Event) -> None:
        while not stop.is_set() and not self.lost.is_set():
            if self.poller is not None and self.poller.done:
                if self.poller.fatal is not None:
                    raise FatalLeaderError("Telegram rejected TOPICBUS_BOT_TOKEN while polling")
                if self.lost.is_set():
                    break
                logger.bind(phase="polling").error("the poller stopped unexpectedly; restarting it")
                self.poller.start()
            await _wait_any(stop, self.lost, 0.5)

    def _lose(self) -> None:
        self.lost.set()
        self.term.revoke()

    def _journaled_batch(self, running: RunningTerm) -> Callable[[float], AbstractAsyncContextManager[None]]:
        """The router's inbound batch, reporting to the health whether the journal took it."""
        @asynccontextmanager
        async def batch(received_at: float) -> AsyncIterator[None]:
            try:
                async with running.inbound_batch(received_at):
                    yield
            except StorageUnavailable as exc:
                self.health.journal_failed(str(exc)[:200])
                raise
            self.health.journal_written()

        return batch

    async def _handler_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        if context.error is not None and update is not None:
            logger.bind(phase="handler").opt(exception=context.error).warning("update handler failed")
        elif context.error is not None:
            logger.bind(phase="job").opt(exception=context.error).warning("job failed")

    async def _teardown(self, app: Application, running: RunningTerm) -> None:
        self.health.end_term()
        await self.server.unpublish("standby" if self.lost.is_set() else "stopping")
        running.stop_title_passes()
        if self.poller is not None:
            await self.poller.stop()
        if self._jobs is not None and not await self._jobs.settle(JOBS_SETTLE_S):
            logger.bind(phase="shutdown").warning("{} job(s) still running after {:g} s; stopping anyway",
                                                  self._jobs.running, JOBS_SETTLE_S)
        await running.close()
        try:
            if app.running:
                await app.stop()
        finally:
            await app.shutdown()


async def _wait_any(a: asyncio.Event, b: asyncio.Event, seconds: float) -> None:
    waiters = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
