"""The composition root of a leadership term: where its adapters are picked, its parts built and
wired, and the order a term opens in.

:func:`assemble` picks the adapters — the SQLite store (``storage/store.SqliteStore``) and the
Telegram gateway (``bot/gateway.TelegramGateway``) — and constructs every use case once, each with
the ports and the few objects it needs (the term's authority, the store, the clock, the event
journal), in an order without cycles (no collaborator is attached after construction).
:func:`open_term` is the start sequence before followers are accepted. The integration tests drive
the :class:`LeaderServices` it builds; the leader process holds only a :class:`RunningTerm`, the
few things it asks of a term. Both use the same functions, so tests exercise exactly the
production composition.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from telegram import Bot
from telegram.ext import Application

from topicbus import handlers
from topicbus.bot.gateway import TelegramGateway
from topicbus.bus import metrics
from topicbus.core.status import StatusReport
from topicbus.core.clock import Clock
from topicbus.core.display import DisplayMode
from topicbus.core.liveness import LivenessPort
from topicbus.core.mutations import FollowerMutationQueue
from topicbus.core.registry import FollowerRegistry
from topicbus.core.startup import StartupWindow, Timers
from topicbus.leader.agent_commands import AgentCommands, OfflineQueue
from topicbus.leader.albums import Albums
from topicbus.leader.buttons import ButtonPresses
from topicbus.leader.control import ControlDesk
from topicbus.leader.delivery import DeliveryHub
from topicbus.leader.departure import DepartureHandler, Departures, ScheduledCleanups
from topicbus.leader.followers import FollowerDesk
from topicbus.leader.inbound import InboundScreen
from topicbus.leader.keyboards import Keyboards
from topicbus.leader.notices import Notices
from topicbus.leader.occupancy import SlotOccupancy
from topicbus.leader.offline import OfflineNotices
from topicbus.leader.outbound import OutboundOptions, OutboundScheduler, ScheduledGateway
from topicbus.leader.output_intake import OutputIntake
from topicbus.leader.preferences import Preferences
from topicbus.leader.press_answers import PressAnswerLane
from topicbus.leader.provisioning import TopicProvisioner
from topicbus.leader.pruner import FollowerPruner
from topicbus.leader.reactions import ReceiptReactions, reaction_emoji
from topicbus.leader.registration import Registrations
from topicbus.leader.roster import Roster
from topicbus.leader.rotation import SlotRotation
from topicbus.leader.routing import InboundBatch, InboundBatches, Router
from topicbus.leader.status import StatusView
from topicbus.leader.term import LeaderTerm, TermTasks
from topicbus.leader.titles import DEBOUNCE_S, DisplayReconciler
from topicbus.leader.topics import ControlTopic, GoneTopics, TopicCache, TopicEvents, TopicsBeingBound
from topicbus.leader.transcription import Transcriber, TranscriptionOptions
from topicbus.logsetup import EventJournal
from topicbus.ports.store import Admission, Store
from topicbus.storage.db import Database
from topicbus.storage.store import SqliteStore


@dataclass
class LeaderServices:
    """Every part of one term, by role: what :func:`open_term` and :func:`close_term` start and stop,
    and what the integration tests drive. The leader process does not hold it (:class:`RunningTerm`)."""

    term: LeaderTerm
    store: Store
    tasks: TermTasks
    events: EventJournal
    gateway: ScheduledGateway
    roster: Roster
    delivery: DeliveryHub
    admission: Admission
    mutations: FollowerMutationQueue
    preferences: Preferences
    control: ControlTopic
    titles: TopicCache
    display: DisplayReconciler
    topics: TopicEvents
    rotation: SlotRotation
    departures: Departures
    pruner: FollowerPruner
    outbound: OutboundScheduler
    notices: Notices
    router: Router
    albums: Albums
    intake: OutputIntake
    batches: InboundBatches
    registrations: Registrations
    control_desk: ControlDesk
    status: StatusView
    followers: FollowerDesk
    agent_commands: AgentCommands
    reactions: ReceiptReactions
    keyboards: Keyboards
    press_answers: PressAnswerLane
    buttons: ButtonPresses
    transcriber: Transcriber


def assemble(term: LeaderTerm, *, db: Database, bot: Bot, clock: Clock, events: EventJournal, chat_id: int,
             timers: Timers, liveness: LivenessPort, default_cleanup: bool, default_display_mode: DisplayMode | None,
             stale_after_ms: int, outbound_options: OutboundOptions, display_debounce_s: float = DEBOUNCE_S,
             offline_ttl_s: float = 86_400.0, receipt_reaction: str | None = "👀", cleanup_grace_s: float = 600.0,
             transcription: TranscriptionOptions = TranscriptionOptions()) -> LeaderServices:
    # The adapters: the SQLite store and the Telegram gateway. Nothing below knows either but by its port.
    sqlite = SqliteStore(db)
    store: Store = sqlite
    telegram = TelegramGateway(bot)
    tasks = TermTasks()
    titles = TopicCache(store.bindings)
    # Who is registered: the roster keeps it; the keyboards under output ask it whether the process
    # that printed a message can still be interrupted.
    registry = FollowerRegistry()
    keyboards = Keyboards(term, registry, store=store, clock=clock)
    # Every outbound call of the term goes through the one scheduler that spends the chat's budget;
    # the use cases get the gateway's methods through it (ScheduledGateway). A topic Telegram says
    # is gone is recorded in the store; its follower learns it at its next heartbeat.
    gone = GoneTopics(term=term, topics=titles, store=store, clock=clock, events=events)
    outbound = OutboundScheduler(term, telegram, outbound_options, on_topic_gone=gone.record, keyboards=keyboards,
                                 store=store, clock=clock, events=events)
    gateway = ScheduledGateway(telegram, outbound)
    # Answers to button presses have a bounded lane of their own beside the scheduler (they spend
    # none of the chat's allowance, and a storm of presses must never delay output); it keeps the
    # chat's RetryAfter pause.
    press_answers = PressAnswerLane(telegram, outbound_options.press_answers,
                                    paused_until=lambda: outbound.budget.paused_until)
    screen = InboundScreen(store.journal, clock, term.authority, offline_ttl_ms=int(offline_ttl_s * 1000))
    # The receipt reaction is the lowest-priority call, skipped while output is held back.
    reactions = ReceiptReactions(react=gateway.set_message_reaction, chat_id=chat_id,
                                 emoji=reaction_emoji(receipt_reaction), spawn=tasks.spawn)
    delivery = DeliveryHub(store.journal, clock, term.authority, screen=screen, on_delivered=reactions.on_delivered)
    roster = Roster(delivery, registry)
    admission = sqlite.admission(term.owner, clock.now_ms, term.authority)
    mutations = FollowerMutationQueue()
    preferences = Preferences(term, default_cleanup=default_cleanup, default_display_mode=default_display_mode, store=store, clock=clock, events=events)
    control = ControlTopic()
    display = DisplayReconciler(term=term, roster=roster, preferences=preferences, control=control, gateway=gateway,
                                admission=admission, timers=timers, titles=titles, gone=gone,
                                debounce_s=display_debounce_s, store=store, events=events)
    topics = TopicEvents(term, roster, titles, gone, display.schedule, store=store)
    provisioner = TopicProvisioner(gateway, preferences, output_moved=outbound.wake, chat_id=chat_id, store=store,
                                   clock=clock, events=events)
    rotation = SlotRotation(term=term, occupancy=SlotOccupancy(roster, store=store, clock=clock), admission=admission,
                            gateway=gateway, gate=provisioner.gate, store=store, clock=clock, events=events)
    notices = Notices(term, control, outbound.wake, store=store, clock=clock)
    handler = DepartureHandler(term, gateway, store=store, clock=clock, events=events)
    departures = Departures(term, roster, preferences, admission, mutations, handler,
                            ScheduledCleanups(term, handler, admission, timers, notices, display.schedule,
                                              grace_ms=int(cleanup_grace_s * 1000), tasks=tasks, store=store, clock=clock, events=events),
                            display.schedule)
    pruner = FollowerPruner(
        registry=registry, now_ms=clock.now_ms, stale_after_ms=stale_after_ms,
        leader_epoch=lambda: term.epoch,
        liveness=lambda r: liveness.probe(r.pid, r.process_birth_id, r.host_id),
        cleanup_policy=preferences.cleanup_policy, on_confirmed_dead=departures.confirmed_dead,
        on_confirmed_dead_preserved=departures.confirmed_dead_preserved, record_event=events.record,
        on_pruned=roster.pruned)
    # A registration's new topic and its binding become routable together: the router holds an
    # update in a topic it does not know until the registrations running now have finished.
    being_bound = TopicsBeingBound()
    # Voice notes as text: downloaded through the gateway (no budget spent), transcribed in the
    # background, released into the binding's delivery (kick) once the transcript is in.
    transcriber = Transcriber(term, notices, transcription, download=gateway.open_download, kick=delivery.kick,
                              store=store, clock=clock, tasks=tasks)
    # Album parts gather in the journal and are sealed into one item a window after the last part.
    albums = Albums(term, roster, delivery, store.journal, clock=clock, timers=timers)
    # A follower whose socket dropped has until it would count as stale to reconnect before the owner
    # is told it is offline.
    offline_notices = OfflineNotices(term, roster, notices, store=store, events=events, timers=timers,
                                     startup=display.startup, reconnect_grace_s=stale_after_ms / 1000)
    router = Router(term, roster, delivery, gateway, notices, albums=albums, offline=offline_notices,
                    being_bound=being_bound, transcriber=transcriber, store=store, clock=clock, events=events)
    # Each getUpdates answer is one batch, journaled in one transaction before the poller confirms it.
    batches = InboundBatches(router)
    # Follower output is stored in the outbox (within each follower's cap) and wakes the scheduler.
    intake = OutputIntake(term, roster, outbound, store=store, clock=clock, events=events)
    offline = OfflineQueue(term, store.journal, notices, screen, timers, clock=clock, events=events, tasks=tasks)
    agent_commands = AgentCommands(term, router, roster, delivery, notices, offline, clock=clock)
    buttons = ButtonPresses(term, router, agent_commands, gateway, press_answers, store=store, clock=clock, tasks=tasks)
    registrations = Registrations(term=term, roster=roster, delivery=delivery, provisioner=provisioner,
                                  rotation=rotation, admission=admission, mutations=mutations, pruner=pruner,
                                  titles=titles, control=control, on_roster_change=display.schedule,
                                  being_bound=being_bound, tasks=tasks, chat_id=chat_id, store=store, clock=clock,
                                  events=events)
    control_desk = ControlDesk(term=term, roster=roster, preferences=preferences, admission=admission,
                               display=display, departures=departures, pruner=pruner, store=store, events=events)
    status = StatusView(term=term, roster=roster, delivery=delivery, preferences=preferences, control=control,
                        router=router, registrations=registrations, outbound=outbound, rotation=rotation,
                        pruner=pruner, store=store, clock=clock, chat_id=chat_id)
    followers = FollowerDesk(roster=roster, registrations=registrations, departures=departures, router=router,
                             intake=intake, events=events)
    return LeaderServices(term=term, store=store, tasks=tasks, events=events, gateway=gateway, delivery=delivery,
                          roster=roster, admission=admission, mutations=mutations, preferences=preferences,
                          control=control, titles=titles, display=display, topics=topics, rotation=rotation,
                          departures=departures, pruner=pruner, outbound=outbound, notices=notices, router=router,
                          batches=batches, intake=intake, albums=albums,
                          registrations=registrations, control_desk=control_desk, status=status, followers=followers,
                          agent_commands=agent_commands, reactions=reactions, keyboards=keyboards,
                          press_answers=press_answers, buttons=buttons, transcriber=transcriber)


async def open_term(services: LeaderServices, *, replay: bool = True,
                    provision_control: Callable[[], Awaitable[bool]] | None = None) -> bool:
    """The start sequence before followers are accepted: the outbound scheduler (through
    which every Telegram call goes), settings, the startup window, holds of earlier leaders dropped,
    pending cleanups replayed, the control topic, the previous roster restored, pruning begun, album
    gathering and the offline queue's sweep. ``provision_control`` provisions the control topic
    (default: once, raising on failure); it returns False when the term should not go on."""
    s = services
    authority = s.term.authority()
    await s.intake.end_departed_streams()  # before the first send: a departed follower's last words notify
    s.outbound.start()  # every Telegram call below (replay, the control topic) goes through it
    await s.preferences.load()
    s.display.startup.begin()
    await s.admission.drop_foreign_holds(authority)
    if replay:
        done, failed = await s.departures.handler.replay(authority)
        if done or failed:
            s.events.record("Replayed pending cleanups", phase="cleanup-replay", completed=done, pending=failed)
        s.departures.scheduled.resume()  # topics in their grace period: deleted when it ends
    if provision_control is None:
        await s.registrations.provision_control_topic()
    elif not await provision_control():
        return False
    s.press_answers.start()
    await s.albums.start()  # albums a crashed term left gathering: sealed one window from now
    await s.transcriber.resume()  # voice notes a crashed term left held: transcribed again
    await s.buttons.resume()
    s.agent_commands.queue.start()
    await s.registrations.restore_roster()
    s.pruner.begin()
    return True


async def close_term(services: LeaderServices) -> None:
    """Stop in reverse: no title pass, no pruning, no output sender, then sockets and background work."""
    services.display.cancel()
    services.pruner.stop()
    await services.outbound.stop()
    await services.press_answers.stop()
    await services.roster.close()
    await services.tasks.close()
    await services.transcriber.close()
    services.term.revoke()


class RunningTerm:
    """What the leader process holds of one term, and the few things it asks of it: its handlers in
    PTB's ``Application``, the bus's view of the leader, the status document, the /metrics figures,
    the inbound batch the poller journals, the periodic prune and purge, and opening and closing."""

    def __init__(self, services: LeaderServices):
        self._s = services
        self.followers: FollowerDesk = services.followers  # what the bus server serves
        self.startup: StartupWindow = services.display.startup  # armed when polling begins
        self.notices: Notices = services.notices  # the greeting in the control topic
        self.receipts: DeliveryHub = services.delivery  # whether receipts reach the journal (/healthz)

    @classmethod
    def assemble(cls, term: LeaderTerm, **parts: Any) -> RunningTerm:
        return cls(assemble(term, **parts))

    def register_handlers(self, app: Application, *, chat_id: int, owner_ids: frozenset[int]) -> None:
        handlers.register_all(app, self._s, chat_id=chat_id, owner_ids=owner_ids)

    async def open(self, *, provision_control: Callable[[], Awaitable[bool]] | None = None) -> bool:
        return await open_term(self._s, provision_control=provision_control)

    async def close(self) -> None:
        await close_term(self._s)

    def stop_title_passes(self) -> None:
        """The first step of a stop, before the poller ends: no title pass starts any more."""
        self._s.display.cancel()

    async def provision_control_topic(self) -> None:
        await self._s.registrations.provision_control_topic()

    def inbound_batch(self, received_at: float) -> AbstractAsyncContextManager[InboundBatch]:
        return self._s.batches.open(received_at)

    async def status(self, role: str) -> StatusReport:
        return await self._s.status.snapshot(role)

    def follower_count(self) -> int:
        return len(self._s.roster)

    async def prune(self) -> None:
        await self._s.pruner.tick()

    async def purge_history(self, keep_ms: int, now_ms: int) -> tuple[int, int, int]:
        """Delivered and sent rows, and inline keyboards, older than ``keep_ms``: how many of each went.
        (A press on a keyboard older than that is answered as stale.)"""
        journal, outbox = await self._s.router.purge_history(keep_ms)
        keyboards = await self._s.store.keyboards.purge(now_ms - keep_ms, self._s.term.authority())
        return journal, outbox, keyboards

    def metrics(self) -> dict[metrics.MetricSpec, Any]:
        """This term's /metrics figures (the process adds its own)."""
        s = self._s
        outbound = s.outbound.figures()
        return {
            metrics.FOLLOWERS: len(s.roster),
            metrics.ROUTED_TOTAL: s.router.routed,
            metrics.DELIVERED_TOTAL: s.delivery.delivered,
            metrics.REGISTRATIONS_TOTAL: s.registrations.count,
            metrics.OUTBOUND_SENT_TOTAL: s.outbound.sent,
            metrics.OUTBOUND_RETRY_AFTER_TOTAL: s.outbound.retry_after_hits,
            metrics.ROUTE_LATENCY_MS: {"0.5": s.router.latency.quantile(0.5) or 0,
                                       "0.99": s.router.latency.quantile(0.99) or 0},
            metrics.DISPLAY_PASSES_TOTAL: s.display.passes,
            metrics.VOICE_NOTES_TOTAL: {"transcribed": s.transcriber.transcribed, "file": s.transcriber.fell_back},
            metrics.DISPLAY_EDITS_TOTAL: s.display.edits,
            metrics.BUDGET_USED: outbound.budget_used,
            metrics.BUDGET_PER_MINUTE: outbound.budget_per_minute,
            metrics.BUDGET_PAUSED_SECONDS: outbound.budget_paused_s,
            metrics.OUTBOX_BACKLOG_ITEMS: outbound.backlog_items,
            metrics.OUTBOX_BACKLOG_CHARS: outbound.backlog_units,
            metrics.OUTBOUND_EDITS_TOTAL: outbound.edits,
            metrics.OUTBOUND_FILES_TOTAL: outbound.files,
            metrics.OUTPUT_CHARS_TOTAL: outbound.units_sent,
            metrics.MESSAGES_PER_KB: outbound.messages_per_kb,
            metrics.PRESS_ANSWERS_TOTAL: s.press_answers.counts,
        }
