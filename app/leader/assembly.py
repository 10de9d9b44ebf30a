"""The one place where a leadership term's parts are built and wired, and the order a term opens in.

:func:`assemble` constructs every use case once, each with the narrow ports it needs, in an order
without cycles (no collaborator is attached after construction). :func:`open_term` is the start
sequence before followers are accepted; the leader process and the integration tests both use
both, so tests exercise exactly the production composition.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from telegram import Bot

from topicbus.bot.gateway import TelegramGateway
from topicbus.core.display import DisplayMode
from topicbus.core.liveness import LivenessPort
from topicbus.core.mutations import FollowerMutationQueue
from topicbus.leader.pruner import FollowerPruner
from topicbus.core.registry import FollowerRegistry
from topicbus.core.startup import Timers
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
from topicbus.leader.reactions import ReceiptReactions, reaction_emoji
from topicbus.leader.registration import Registrations
from topicbus.leader.roster import Roster
from topicbus.leader.rotation import SlotRotation
from topicbus.leader.routing import InboundBatches, Router
from topicbus.leader.status import StatusView
from topicbus.leader.term import LeaderTerm
from topicbus.leader.titles import DEBOUNCE_S, DisplayReconciler
from topicbus.leader.topics import ControlTopic, TopicCache, TopicEvents, TopicsBeingBound, record_topic_gone
from topicbus.leader.transcription import Transcriber, TranscriptionOptions
from topicbus.storage.admission import AdmissionLedger
from topicbus.storage.bindings import BindingRepository
from topicbus.storage.journal import JournalRepository


@dataclass
class LeaderServices:
    """Everything one term runs, by role."""

    term: LeaderTerm
    gateway: ScheduledGateway
    roster: Roster
    delivery: DeliveryHub
    admission: AdmissionLedger
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


def assemble(term: LeaderTerm, *, bot: Bot, timers: Timers, liveness: LivenessPort, default_cleanup: bool,
             default_display_mode: DisplayMode | None, stale_after_ms: int, outbound_options: OutboundOptions,
             display_debounce_s: float = DEBOUNCE_S, offline_ttl_s: float = 86_400.0,
             receipt_reaction: str | None = "👀", cleanup_grace_s: float = 600.0,
             transcription: TranscriptionOptions = TranscriptionOptions()) -> LeaderServices:
    telegram = TelegramGateway(bot)
    titles = TopicCache(BindingRepository(term.db))
    # Who is registered: the roster keeps it; the keyboards under output ask it whether the process
    # that printed a message can still be interrupted.
    registry = FollowerRegistry()
    keyboards = Keyboards(term, registry)
    # Every outbound call of the term goes through the one scheduler that spends the chat's budget;
    # the use cases get the gateway's methods through it (ScheduledGateway). A topic Telegram says
    # is gone is recorded in the store; its follower learns it at its next heartbeat.
    outbound = OutboundScheduler(term, telegram, outbound_options,
                                 on_topic_gone=functools.partial(record_topic_gone, term, titles), keyboards=keyboards)
    gateway = ScheduledGateway(telegram, outbound)
    # Answers to button presses have a bounded lane of their own beside the scheduler (they spend
    # none of the chat's allowance, and a storm of presses must never delay output); it keeps the
    # chat's RetryAfter pause.
    press_answers = PressAnswerLane(telegram, outbound_options.press_answers,
                                    paused_until=lambda: outbound.budget.paused_until)
    journal = JournalRepository(term.db)
    screen = InboundScreen(journal, term.clock, term.authority, offline_ttl_ms=int(offline_ttl_s * 1000))
    # The receipt reaction is the lowest-priority call, skipped while output is held back.
    reactions = ReceiptReactions(react=gateway.set_message_reaction, chat_id=term.chat_id,
                                 emoji=reaction_emoji(receipt_reaction), spawn=term.spawn)
    delivery = DeliveryHub(journal, term.clock, term.authority, screen=screen, on_delivered=reactions.on_delivered)
    roster = Roster(delivery, registry)
    admission = AdmissionLedger(term.db, term.owner, term.now_ms, term.authority)
    mutations = FollowerMutationQueue()
    preferences = Preferences(term, default_cleanup=default_cleanup, default_display_mode=default_display_mode)
    control = ControlTopic()
    display = DisplayReconciler(term=term, roster=roster, preferences=preferences, control=control, gateway=gateway,
                                admission=admission, timers=timers, titles=titles, debounce_s=display_debounce_s)
    topics = TopicEvents(term, roster, titles, display.schedule)
    provisioner = TopicProvisioner(term, gateway, preferences, output_moved=outbound.wake)
    rotation = SlotRotation(term=term, occupancy=SlotOccupancy(term, roster), admission=admission, gateway=gateway,
                            gate=provisioner.gate)
    notices = Notices(term, control, outbound.wake)
    handler = DepartureHandler(term, gateway)
    departures = Departures(term, roster, preferences, admission, mutations, handler,
                            ScheduledCleanups(term, handler, admission, timers, notices, display.schedule,
                                              grace_ms=int(cleanup_grace_s * 1000)),
                            display.schedule)
    pruner = FollowerPruner(
        registry=registry, now_ms=term.now_ms, stale_after_ms=stale_after_ms,
        leader_epoch=lambda: term.epoch,
        liveness=lambda r: liveness.probe(r.pid, r.process_birth_id, r.host_id),
        cleanup_policy=preferences.cleanup_policy, on_confirmed_dead=departures.confirmed_dead,
        on_confirmed_dead_preserved=departures.confirmed_dead_preserved, record_event=term.events.record,
        on_pruned=roster.pruned)
    # A registration's new topic and its binding become routable together: the router holds an
    # update in a topic it does not know until the registrations running now have finished.
    being_bound = TopicsBeingBound()
    # Voice notes as text: downloaded through the gateway (no budget spent), transcribed in the
    # background, released into the binding's delivery (kick) once the transcript is in.
    transcriber = Transcriber(term, notices, transcription, download=gateway.open_download, kick=delivery.kick)
    # Album parts gather in the journal and are sealed into one item a window after the last part.
    albums = Albums(term, roster, delivery, journal, timers=timers)
    # A follower whose socket dropped has until it would count as stale to reconnect before the owner
    # is told it is offline.
    offline = OfflineNotices(term, roster, notices, timers=timers, startup=display.startup,
                             reconnect_grace_s=stale_after_ms / 1000)
    router = Router(term, roster, delivery, gateway, notices, albums=albums, offline=offline,
                    being_bound=being_bound, transcriber=transcriber)
    # Each getUpdates answer is one batch, journaled in one transaction before the poller confirms it.
    batches = InboundBatches(router)
    # Follower output is stored in the outbox (within each follower's cap) and wakes the scheduler.
    intake = OutputIntake(term, roster, outbound)
    agent_commands = AgentCommands(term, router, roster, delivery, notices,
                                   OfflineQueue(term, journal, notices, screen, timers))
    buttons = ButtonPresses(term, router, agent_commands, gateway, press_answers)
    registrations = Registrations(term=term, roster=roster, delivery=delivery, provisioner=provisioner,
                                  rotation=rotation, admission=admission, mutations=mutations, pruner=pruner, titles=titles,
                                  control=control, on_roster_change=display.schedule, being_bound=being_bound)
    control_desk = ControlDesk(term=term, roster=roster, preferences=preferences, admission=admission,
                               display=display, departures=departures, pruner=pruner)
    status = StatusView(term=term, roster=roster, delivery=delivery, preferences=preferences, control=control,
                        router=router, registrations=registrations, outbound=outbound, rotation=rotation, pruner=pruner)
    followers = FollowerDesk(term=term, roster=roster, registrations=registrations, departures=departures,
                             router=router, intake=intake)
    return LeaderServices(term=term, gateway=gateway, roster=roster, delivery=delivery, admission=admission,
                          mutations=mutations, preferences=preferences,
                          control=control, titles=titles, display=display, topics=topics, rotation=rotation,
                          departures=departures, pruner=pruner, outbound=outbound, notices=notices, router=router,
                          batches=batches, intake=intake, albums=albums,
                          registrations=registrations, control_desk=control_desk, status=status, followers=followers,
                          agent_commands=agent_commands, reactions=reactions, keyboards=keyboards,
                          press_answers=press_answers, buttons=buttons, transcriber=transcriber)


async def open_term(services: LeaderServices, *, replay: bool = True,
                    provision_control: Callable[[], Awaitable[bool]] | None = None) -> bool:
    """The start sequence before followers are accepted (SPEC §6.5): the outbound scheduler (through
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
            s.term.events.record("Replayed pending cleanups", phase="cleanup-replay", completed=done, pending=failed)
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
    await services.term.close()
    await services.transcriber.close()
    services.term.revoke()
