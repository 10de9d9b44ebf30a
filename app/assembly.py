"""Builds a :class:`LeaderRuntime` and its collaborators from a bot, a store and a clock.

The one place where the runtime's parts are wired; the leader process and the integration tests
both use it, so tests exercise exactly the production composition.
"""

from __future__ import annotations

from telegram import Bot
from telegram.ext import JobQueue

from app import __version__
from app.clock import Clock
from app.departure import DepartureHandler
from app.display_reconciler import DisplayReconciler
from app.liveness import LivenessPort
from app.logsetup import EventJournal
from app.outbox import OutboundSender
from app.provisioning import TopicProvisioner
from app.rotation import SlotRotation
from app.pruning import FollowerPruner
from app.runtime import LeaderRuntime
from app.settings import DisplayMode
from app.telegram_api import TelegramGateway
from storage.admission import AdmissionLedger
from storage.bindings import BindingRepository
from storage.cleanups import CleanupRepository
from storage.db import Database
from storage.outbox import OutboxRepository


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
