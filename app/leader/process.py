"""Composition root of ``topicbus leader``: lease election, one leadership term, graceful stop.

``LeaderProcess.run`` holds the process-wide pieces (store, HTTP/bus server) and loops: wait as
standby until the lease is ours, lead until stopped or the lease is lost, repeat. ``LeadershipTerm``
wires one term: the PTB ``Application`` (handlers, JobQueue, rate limiter), the runtime, the
outbound sender, the pruner and the poller — started in that order and stopped in reverse.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import uuid
from typing import Any

from loguru import logger
from telegram.error import InvalidToken, NetworkError, TimedOut
from telegram.ext import AIORateLimiter, Application, ApplicationBuilder, ContextTypes

from topicbus import handlers
from topicbus.leader.assembly import assemble_pruner, assemble_runtime
from topicbus.bus.server import BusServer, prometheus
from topicbus.core.clock import Clock, SystemClock
from topicbus.host import ProcessLiveness, current_host_id
from topicbus.logsetup import EventJournal
from topicbus.leader.outbound import OutboundSender
from topicbus.bot.poller import UpdatePoller
from topicbus.leader.provisioning import SlotUnavailable, TopicCreationFailed
from topicbus.core.pruning import FollowerPruner
from topicbus.leader.rotation import RotationBlocked
from topicbus.storage.admission import AdmissionBlocked
from topicbus.leader.runtime import LeaderRuntime
from topicbus.settings import Settings
from topicbus.storage.db import Authority, Database
from topicbus.storage.lease import LeaseRepository

STANDBY_POLL_S = 0.5
PRUNE_JOB_ID = "topicbus.prune"
LEASE_JOB_ID = "topicbus.lease"
PURGE_JOB_ID = "topicbus.purge"
PURGE_INTERVAL_S = 3600
HISTORY_KEEP_MS = 7 * 24 * 3600 * 1000  # delivered/sent rows are kept a week for diagnosis


class FatalLeaderError(Exception):
    """The leader cannot run with this configuration (e.g. Telegram rejects the token)."""


class LeaderProcess:
    def __init__(self, settings: Settings, *, clock: Clock | None = None):
        self.settings = settings
        self.clock = clock or SystemClock()
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.events = EventJournal()
        self.term: LeadershipTerm | None = None
        self.server = BusServer(
            host=settings.bus_host, port=settings.bus_port,
            secret=settings.bus_secret.get_secret_value() if settings.bus_secret else None,
            status=self._status, metrics=self._metrics)

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
                authority = await leases.try_acquire(self.owner, self.clock.now_ms(),
                                                     self.settings.lease_stale_after_ms)
                if authority is None:
                    if self.server.role != "standby" or not announced:
                        logger.bind(phase="lease").info("another leader holds the lease; waiting as standby")
                        announced = True
                    self.server.role = "standby"
                    await _wait(stop, STANDBY_POLL_S)
                    continue
                logger.bind(phase="lease").info("leader lease acquired (epoch {})", authority.epoch)
                self.term = LeadershipTerm(self.settings, db, authority, self.server, self.clock, self.events,
                                           self.owner)
                lost = await self.term.run(stop)
                self.term = None
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

    async def _status(self) -> dict[str, Any]:
        if self.term is not None and self.term.runtime is not None:
            snapshot = await self.term.runtime.status_snapshot()
            snapshot["role"] = self.server.role
            return snapshot
        return {"role": self.server.role, "epoch": self.server.epoch, "followers": [], "bindings": []}

    def _metrics(self) -> str:
        term = self.term
        runtime = term.runtime if term else None
        values: dict[str, float | int] = {
            "topicbus_leader": 1 if self.server.role == "leader" else 0,
            "topicbus_epoch": self.server.epoch,
            "topicbus_followers": len(runtime.registry) if runtime else 0,
        }
        if runtime is not None and term is not None:
            values.update({
                "topicbus_routed_total": runtime.stats["routed"],
                "topicbus_delivered_total": runtime.hub.delivered,
                "topicbus_registrations_total": runtime.stats["registrations"],
                "topicbus_outbound_sent_total": runtime.outbox.sent,
                "topicbus_outbound_retry_after_total": runtime.outbox.retry_after_hits,
                "topicbus_updates_seen_total": term.poller.updates_seen if term.poller else 0,
                'topicbus_route_latency_ms{quantile="0.5"}': runtime.route_latency.quantile(0.5) or 0,
                'topicbus_route_latency_ms{quantile="0.99"}': runtime.route_latency.quantile(0.99) or 0,
                "topicbus_display_passes_total": runtime.display.passes if runtime.display else 0,
                "topicbus_display_edits_total": runtime.display.edits if runtime.display else 0,
            })
        return prometheus(values, {k: k.replace("_", " ") for k in values})


class LeadershipTerm:
    """Everything that exists only while this process holds the lease."""

    def __init__(self, settings: Settings, db: Database, authority: Authority, server: BusServer, clock: Clock,
                 events: EventJournal, owner: str):
        self.settings = settings
        self.db = db
        self.authority = authority
        self.server = server
        self.clock = clock
        self.events = events
        self.owner = owner
        self.runtime: LeaderRuntime | None = None
        self.poller: UpdatePoller | None = None
        self.pruner: FollowerPruner | None = None
        self.lost = asyncio.Event()
        self._leases = LeaseRepository(db)
        self._polled_once = False

    def build_application(self) -> Application:
        s = self.settings
        assert s.bot_token is not None
        base = s.api_base_url
        builder = (ApplicationBuilder().token(s.bot_token.get_secret_value()).base_url(base)
                   .base_file_url(base.replace("/bot", "/file/bot", 1)).updater(None)
                   .rate_limiter(AIORateLimiter(overall_max_rate=s.rate_limit_per_second,
                                                group_max_rate=s.rate_limit_per_chat_per_minute, max_retries=0))
                   .connect_timeout(10).read_timeout(15).write_timeout(30).pool_timeout(5))
        app = builder.build()
        if app.job_queue is None:
            raise FatalLeaderError("python-telegram-bot was installed without the job-queue extra")
        return app

    async def run(self, stop: asyncio.Event) -> bool:
        """Lead until ``stop`` or until the lease is lost; returns True when it was lost."""
        s = self.settings
        app = self.build_application()
        initialized = await self._initialize(app, stop)
        if not initialized or stop.is_set():
            if initialized:
                await app.shutdown()
            return self.lost.is_set()
        host_id = current_host_id()
        runtime = assemble_runtime(db=self.db, bot=app.bot, clock=self.clock, events=self.events, owner=self.owner,
                                   chat_id=s.chat_id or 0, liveness=ProcessLiveness(host_id),
                                   default_cleanup=s.thread_cleanup, default_display_mode=s.display_mode,
                                   job_queue=app.job_queue)
        outbox, departure = runtime.outbox, runtime.departure
        runtime.authority = self.authority
        self.runtime = runtime
        self.poller = UpdatePoller(app, timeout_s=s.poll_timeout_s, on_first_poll=self._polling_started,
                                   batch=runtime.inbound_batch)
        handlers.register_all(app, runtime, chat_id=s.chat_id or 0, owner_ids=s.owner_ids)
        app.add_error_handler(self._handler_error)
        jq = app.job_queue
        assert jq is not None
        self.server.role, self.server.epoch = "starting", self.authority.epoch
        await app.start()
        try:
            jq.run_repeating(self._refresh_lease, interval=s.lease_refresh_ms / 1000, first=s.lease_refresh_ms / 1000,
                             name=LEASE_JOB_ID, job_kwargs={"id": LEASE_JOB_ID, "replace_existing": True,
                                                            "misfire_grace_time": None, "coalesce": True})
            await runtime.load_runtime_settings()
            runtime.display.begin_startup()
            await runtime.admission.drop_foreign_leases(self.authority)
            done, failed = await departure.replay(self.authority)
            if done or failed:
                self.events.record("Replayed pending cleanups", phase="cleanup-replay", completed=done,
                                   pending=failed)
            await self._provision_control_topic(runtime, stop)
            if stop.is_set() or self.lost.is_set():
                return self.lost.is_set()
            outbox.start()
            await runtime.restore_roster()
            self.pruner = assemble_pruner(runtime, clock=self.clock, stale_after_ms=s.follower_stale_after_ms,
                                          events=self.events)
            self.pruner.begin()
            jq.run_repeating(self._prune, interval=s.prune_interval_ms / 1000, first=s.prune_interval_ms / 1000,
                             name=PRUNE_JOB_ID, job_kwargs={"id": PRUNE_JOB_ID, "replace_existing": True,
                                                            "coalesce": True, "max_instances": 1,
                                                            "misfire_grace_time": None})
            jq.run_repeating(self._purge, interval=PURGE_INTERVAL_S, first=60, name=PURGE_JOB_ID,
                             job_kwargs={"id": PURGE_JOB_ID, "replace_existing": True, "coalesce": True,
                                         "max_instances": 1})
            self.server.publish(runtime, self.authority.epoch)
            self.poller.start()
            await self._wait_until_done(stop)
        finally:
            await self._teardown(app, outbox, runtime)
        return self.lost.is_set()

    async def _provision_control_topic(self, runtime: LeaderRuntime, stop: asyncio.Event) -> None:
        """The control topic is needed before followers are accepted; retry until Telegram allows it."""
        delay = 1.0
        while not stop.is_set() and not self.lost.is_set():
            try:
                await runtime.provision_control_topic()
                return
            except (TopicCreationFailed, SlotUnavailable, RotationBlocked, AdmissionBlocked) as exc:
                logger.bind(phase="leader-provision").error(
                    "cannot provision the control topic: {} — check that the bot is an admin with Manage Topics "
                    "in a forum chat; retrying in {:.0f}s", exc, delay)
            await _wait_any(stop, self.lost, delay)
            delay = min(delay * 2, 60.0)

    async def _initialize(self, app: Application, stop: asyncio.Event) -> bool:
        """``getMe`` until Telegram answers. The lease refresh job does not run yet, so the lease is
        refreshed here: a leader that waited past the stale window must not start polling."""
        delay = 0.5
        while not stop.is_set():
            try:
                await app.initialize()
                return True
            except InvalidToken as exc:
                raise FatalLeaderError("Telegram rejected TOPICBUS_BOT_TOKEN (getMe failed)") from exc
            except (TimedOut, NetworkError) as exc:
                logger.bind(phase="startup").warning("Telegram not reachable ({}); retrying", type(exc).__name__)
                await _wait(stop, delay)
                delay = min(delay * 2, 15.0)
                if not await self._leases.refresh(self.authority, self.clock.now_ms()):
                    self.lost.set()
                    return False
        return False

    def _polling_started(self) -> None:
        self.server.polling = True
        if self._polled_once:  # a restarted poller: the startup window is not opened again
            return
        self._polled_once = True
        # Everything built so far (PTB, handlers, runtime) lives as long as the term: keep it out of
        # the cyclic collector's scans so collections on the routing path stay short.
        gc.collect()
        gc.freeze()
        if self.runtime is not None and self.runtime.display is not None:
            self.runtime.display.arm_startup(self.settings.follower_stale_after_ms / 1000)
        logger.bind(phase="startup").info("polling Telegram as leader (epoch {})", self.authority.epoch)

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

    async def _refresh_lease(self, context: ContextTypes.DEFAULT_TYPE) -> None:
        try:
            still = await self._leases.refresh(self.authority, self.clock.now_ms())
        except Exception as exc:  # noqa: BLE001 - a busy database: try again next tick
            logger.bind(phase="lease").warning("lease refresh failed ({}); will retry", type(exc).__name__)
            return
        if not still:
            self.lost.set()
            if self.runtime is not None:
                self.runtime.authority = None

    async def _purge(self, context: ContextTypes.DEFAULT_TYPE) -> None:
        if self.runtime is not None:
            journal, outbox = await self.runtime.purge_history(HISTORY_KEEP_MS)
            if journal or outbox:
                logger.bind(phase="purge").info("purged {} delivered messages and {} sent outputs", journal, outbox)

    async def _prune(self, context: ContextTypes.DEFAULT_TYPE) -> None:
        if self.pruner is not None:
            await self.pruner.tick()

    async def _handler_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        if self.poller is not None:
            await self.poller.handler_error(update, context)
        if context.error is not None and update is not None:
            logger.bind(phase="handler").opt(exception=context.error).warning("update handler failed")
        elif context.error is not None:
            logger.bind(phase="job").opt(exception=context.error).warning("job failed")

    async def _teardown(self, app: Application, outbox: OutboundSender, runtime: LeaderRuntime) -> None:
        await self.server.unpublish("standby" if self.lost.is_set() else "stopping")
        if runtime.display is not None:
            runtime.display.cancel_startup()
        if self.poller is not None:
            await self.poller.stop()
        if self.pruner is not None:
            self.pruner.stop()
        await outbox.stop()
        await runtime.close()
        runtime.authority = None
        try:
            if app.running:
                await app.stop()
        finally:
            await app.shutdown()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


async def _wait_any(a: asyncio.Event, b: asyncio.Event, seconds: float) -> None:
    waiters = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
