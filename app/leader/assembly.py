"""Builds a :class:`LeaderRuntime` and its collaborators from a bot, a store and a clock.

The one place where the runtime's parts are wired; the leader process and the integration tests
both use it, so tests exercise exactly the production composition.
"""

from __future__ import annotations

from telegram import Bot
from telegram.ext import JobQueue

from topicbus import __version__
from topicbus.core.clock import Clock
from topicbus.leader.departure import DepartureHandler
from topicbus.leader.display_reconciler import DisplayReconciler
from topicbus.host import LivenessPort
from topicbus.logsetup import EventJournal
from topicbus.leader.outbound import OutboundSender
from topicbus.leader.provisioning import TopicProvisioner
from topicbus.leader.rotation import SlotRotation
from topicbus.core.pruning import FollowerPruner
from topicbus.leader.runtime import LeaderRuntime
from topicbus.settings import DisplayMode
from topicbus.bot.gateway import TelegramGateway
from topicbus.storage.admission import AdmissionLedger
from topicbus.storage.bindings import BindingRepository
from topicbus.storage.cleanups import CleanupRepository
from topicbus.storage.db import Database
from topicbus.storage.outbox import OutboxRepository


def assemble_runtime(*, db: Database, bot: Bot, clock: Clock, events: EventJournal, owner: str, chat_id: int,
                     liveness: LivenessPort, default_cleanup: bool,
                     default_display_mode: DisplayMode, job_queue: JobQueue | None = None) -> LeaderRuntime:
    gateway = TelegramGateway(bot)
    bindings = BindingRepository(db)
    admission = AdmissionLedger(db, owner, clock.now_ms)
    runtime: LeaderRuntime
    provisioner = TopicProvisioner(db=db, bindings=bindings, gateway=gateway, clock=clock, chat_id=chat_id,
                                   display_mode=lambda: runtime.display_mode)
    departure = DepartureHandler(db=db, bindings=bindings, cleanups=CleanupRepository(db), gateway=gateway,
                                 clock=clock, events=events)
    outbox = OutboundSender(repo=OutboxRepository(db), gateway=gateway, clock_ms=clock.now_ms, events=events,
                            on_topic_gone=lambda chat, thread: runtime.topic_gone(chat, thread))
    runtime = LeaderRuntime(db=db, clock=clock, chat_id=chat_id, provisioner=provisioner, gateway=gateway,
                            departure=departure, outbox=outbox, liveness=liveness, events=events,
                            default_cleanup=default_cleanup, default_display_mode=default_display_mode,
                            leader_build=f"topicbus/{__version__}", admission=admission)
    runtime.rotation = SlotRotation(db=db, bindings=bindings, admission=admission, gateway=gateway,
                                    runtime=runtime, events=events, gate=provisioner.gate)
    runtime.display = DisplayReconciler(db=db, bindings=bindings, gateway=gateway, admission=admission,
                                        events=events, runtime=runtime, job_queue=job_queue)
    return runtime


def assemble_pruner(runtime: LeaderRuntime, *, clock: Clock, stale_after_ms: int,
                    events: EventJournal) -> FollowerPruner:
    """The prune pass over the runtime's registry, with the runtime's ports."""
    pruner = FollowerPruner(
        registry=runtime.registry, mutations=runtime.mutations, now_ms=clock.now_ms, stale_after_ms=stale_after_ms,
        leader_epoch=runtime.epoch, profile=lambda: "default", liveness=runtime.probe,
        cleanup_policy=runtime.cleanup_policy, on_confirmed_dead=runtime.on_confirmed_dead,
        on_confirmed_dead_preserved=runtime.on_confirmed_dead_preserved, record_event=events.record,
    )
    runtime.attach_pruner(pruner)
    return pruner
