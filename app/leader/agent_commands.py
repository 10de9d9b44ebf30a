"""Reserved commands in agent topics (README, "In an agent's topic") and the offline queue they look at.

Only ``/interrupt``, ``/kill``, ``/eof``, ``/screen``, ``/queue`` and ``/drop`` are intercepted, with or
without ``@thisbot`` (:func:`parse_reserved`); everything else reaches the agent (``handlers/topic_messages``).

**Controls** (``/interrupt``, ``/kill``, ``/eof``, ``/screen``, and the Interrupt button through
:meth:`AgentCommands.send_control`) are ``control`` deliveries bound to one follower generation:

* never journaled: sent at once to the generation that is live, or not at all;
* a command typed more than :data:`CONTROL_TTL_MS` ago is not sent (Telegram may hand over an old
  update after the leader was down), nor one typed before the live follower registered (it was
  meant for an earlier process: after a leader crash the same update is fetched again, and a
  successor must not get the ``/kill`` of its predecessor);
* ``/kill`` is answered as soon as it is handed to the follower (:data:`KILL_SENT_TEXT`: the
  follower sends SIGTERM, then SIGKILL after 5 s), so the topic is not silent until the exit notice;
* when it is not sent (agent offline, no ``control-v1``, too old, meant for an earlier process;
  for ``/screen`` no ``screen-v1``: the agent does not run on a terminal), the topic is told why.
  Each one has its own delivery id (``c-…``); the follower's receipt changes nothing on the leader.

**The offline queue** (:class:`OfflineQueue`): ``/queue`` counts every journal row that waits for
the agent (an album still gathering once) and lists the oldest, ``/drop`` settles them as
``dropped``; rows older than ``TOPICBUS_OFFLINE_TTL_S`` expire (the
:class:`~topicbus.leader.inbound.InboundScreen` never sends one, the sweep settles the others) and
the topic is told which ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loguru import logger

from topicbus.core.target import Target
from topicbus.ports.store import Journal
from topicbus.core.clock import Clock
from topicbus.logsetup import EventJournal
from collections.abc import Callable
from topicbus.core.startup import Timers
from topicbus.core.records import ControlItem, InboundItem
from topicbus.leader.delivery import DeliveryHub
from topicbus.leader.inbound import InboundScreen, age_text, combine_album, preview
from topicbus.leader.notices import Notices
from topicbus.leader.roster import Roster
from topicbus.leader.routing import InboundBatch, Router
from topicbus.leader.term import LeaderTerm, TermTasks, new_operation_id
from topicbus.protocol import CAP_CONTROL, CAP_SCREEN
from topicbus.core.authority import AuthorityLost
from topicbus.core.journal import JournalItem

CONTROL_ACTIONS = ("interrupt", "kill", "eof", "screen")
RESERVED_COMMANDS = (*CONTROL_ACTIONS, "queue", "drop")
KILL_SENT_TEXT = "⏳ SIGTERM sent; SIGKILL in 5 s if it does not exit"
CONTROL_TTL_MS = 60_000  # a control typed longer ago than this is never sent
CLOCK_SLACK_MS = 2_000  # Telegram dates are whole seconds, and its clock is not ours
QUEUE_LINES = 15  # entries /queue lists: the oldest; the count covers all of them
QUEUE_ROWS = 500  # journal rows read to list them (album parts still gathering are rows of one entry)
EXPIRY_JOB_ID = "topicbus.offline-expiry"

_COMMAND = re.compile(r"/([A-Za-z]+)(?:@([A-Za-z0-9_]+))?(?=\s|$)")


def parse_reserved(text: str, bot_username: str | None) -> str | None:
    """The reserved command a message text is (lower case), else None. ``/kill@otherbot`` is not
    ours; ``//kill`` is the escape for a literal ``/kill``."""
    match = _COMMAND.match(text)
    if match is None:
        return None
    command, addressee = match.group(1).lower(), match.group(2)
    if command not in RESERVED_COMMANDS:
        return None
    if addressee is not None and (bot_username is None or addressee.lower() != bot_username.lower()):
        return None
    return command


@dataclass(frozen=True)
class ControlOutcome:
    """What became of one control: ``sent``, else ``reason`` (offline, unsupported, expired,
    earlier-process) and ``text``, the explanation the topic gets."""

    sent: bool
    reason: str = "sent"
    text: str = ""


def collapse_albums(items: list[JournalItem]) -> list[tuple[JournalItem, InboundItem]]:
    """Rows as the owner thinks of them: the parts of an album still gathering are one entry."""
    entries: list[list[JournalItem]] = []
    albums: dict[str, list[JournalItem]] = {}
    for item in items:
        if item.status == "gathering" and item.media_group:
            if item.media_group in albums:
                albums[item.media_group].append(item)
                continue
            albums[item.media_group] = [item]
            entries.append(albums[item.media_group])
        else:
            entries.append([item])
    return [(group[0], combine_album([i.payload for i in group]) if len(group) > 1 else group[0].payload)
            for group in entries]


def expiry_interval_s(ttl_ms: int) -> float:
    """How often the offline queue is swept: a quarter of the TTL, between 1 s and 60 s."""
    return min(max(ttl_ms / 4000, 1.0), 60.0)


class OfflineQueue:
    def __init__(self, term: LeaderTerm, journal: Journal, notices: Notices, screen: InboundScreen,
                 timers: Timers | None, *, clock: Clock, events: EventJournal, tasks: TermTasks):
        self._term = term
        self._clock = clock
        self._events = events
        self._tasks = tasks
        self._journal = journal
        self._notices = notices
        self._screen = screen
        self._timers = timers

    @property
    def ttl_ms(self) -> int | None:
        return self._screen.offline_ttl_ms

    def start(self) -> None:
        """Sweep now and then, and report at once what the delivery hub expired."""
        self._arm()
        self._tasks.spawn(self._watch())

    def _arm(self) -> None:
        if self._timers is not None and self.ttl_ms and self._term.current() is not None:
            self._timers.once(EXPIRY_JOB_ID, expiry_interval_s(self.ttl_ms), self._tick)

    async def _tick(self) -> None:
        try:
            await self.sweep()
        finally:
            self._arm()

    async def _watch(self) -> None:
        while True:
            await self._screen.expired.wait()
            self._screen.expired.clear()
            try:
                await self.report()
            except AuthorityLost:
                return
            except Exception as exc:  # noqa: BLE001 - the next sweep reports them
                logger.bind(phase="offline-expiry").warning("expiry report failed ({})", type(exc).__name__)

    async def sweep(self) -> int:
        """Expire every row older than the TTL, then tell each topic; returns how many expired."""
        if not self.ttl_ms:
            return 0
        try:
            now = self._clock.now_ms()
            expired = await self._journal.expire_older_than(now - self.ttl_ms, now, self._term.authority())
            await self.report()
        except AuthorityLost:
            return 0
        return expired

    async def report(self) -> None:
        """One notice per topic for the rows that expired since the last report."""
        for binding_key, items in (await self._journal.unreported_expired()).items():
            authority = self._term.authority()
            await self._notices.post(binding_key, self._expiry_text(items), authority=authority)
            await self._journal.mark_reported([i.seq for i in items], self._clock.now_ms(), authority)
            self._events.record("Messages for an offline agent expired", phase="offline-expiry",
                                     bindingKey=binding_key, count=len(items))

    def _expiry_text(self, items: list[JournalItem]) -> str:
        n = len(items)
        head = (f"⌛ {n} message{'s' if n != 1 else ''} waited more than {age_text(self.ttl_ms or 0)} for this "
                f"agent and expired; it will not get {'them' if n != 1 else 'it'}:")
        return "\n".join([head, *self._lines(items)])

    def _lines(self, items: list[JournalItem], total: int | None = None) -> list[str]:
        """The oldest :data:`QUEUE_LINES` entries of ``items``, then how many more there are of
        ``total`` (default: of ``items``)."""
        now = self._clock.now_ms()
        entries = collapse_albums(items)
        total = len(entries) if total is None else total
        lines = [f"• {age_text(now - first.created_at_ms)} ago: {preview(payload) or '(empty)'}"
                 for first, payload in entries[:QUEUE_LINES]]
        if total > QUEUE_LINES:
            lines.append(f"… and {total - QUEUE_LINES} more")
        return lines

    async def show(self, binding_key: str, *, online: bool) -> str:
        """``/queue``: how many things wait for the agent, all of them counted (an album still
        gathering counts once), and the oldest :data:`QUEUE_LINES`."""
        n = await self._journal.count_waiting_entries(binding_key)
        items = await self._journal.pending(binding_key, limit=QUEUE_ROWS) if n else []
        if not items:
            return ("Nothing waits: the agent is online and has every message." if online
                    else "Nothing waits for this agent.")
        if online:
            head = (f"📤 {n} message{'s are' if n != 1 else ' is'} on the way to the agent "
                    "(it has not confirmed them yet):")
        else:
            head = f"📥 {n} message{'s wait' if n != 1 else ' waits'} for this agent (offline):"
        tail = "/drop discards them."
        if self.ttl_ms:
            tail += f" Unless the agent returns within {age_text(self.ttl_ms)} of each, they expire."
        return "\n".join([head, *self._lines(items, n), tail])

    async def drop(self, binding_key: str, *, online: bool) -> str:
        """``/drop``: nothing that waits is delivered any more."""
        dropped = await self._journal.drop_waiting(binding_key, self._clock.now_ms(), self._term.authority())
        if not dropped:
            return "Nothing to drop: no message waits for this agent."
        self._events.record("Owner dropped waiting messages", phase="offline-drop", bindingKey=binding_key,
                                 count=dropped)
        text = f"🗑 Dropped {dropped} message{'s' if dropped != 1 else ''}: the agent will not get {'them' if dropped != 1 else 'it'}."
        if online:
            text += " (The agent is online: what it already received may still be handled.)"
        return text


class AgentCommands:
    """The reserved commands of agent topics, and the control path a button press reuses."""

    def __init__(self, term: LeaderTerm, router: Router, roster: Roster, delivery: DeliveryHub, notices: Notices,
                 queue: OfflineQueue, *, clock: Clock, new_id: Callable[[], str] = new_operation_id):
        self._term = term
        self._clock = clock
        self._new_id = new_id
        self._router = router
        self._roster = roster
        self._delivery = delivery
        self._notices = notices
        self.queue = queue
        self.sent = 0

    async def handle(self, chat_id: int, thread_id: int, command: str, *, update_id: int,
                     message_id: int | None = None, typed_at_ms: int | None = None,
                     batch: InboundBatch | None = None) -> bool:
        """One reserved command typed in a topic; False when the topic is not an agent's. What
        the owner sent before it in the same ``batch`` is journaled and delivered first."""
        binding_key = await self._router.binding_for_topic(Target(chat_id, thread_id))
        if binding_key is None:
            return False
        await self._router.flush(batch)
        online = self._router.live_follower(binding_key) is not None
        if command in CONTROL_ACTIONS:
            await self.send_control(binding_key, command, message_id=message_id, typed_at_ms=typed_at_ms,
                                    origin=f"u{update_id}")
        elif command == "queue":
            await self._notices.post(binding_key, await self.queue.show(binding_key, online=online))
        elif command == "drop":
            await self._notices.post(binding_key, await self.queue.drop(binding_key, online=online))
        return True

    async def send_control(self, binding_key: str, action: str, *, message_id: int | None = None,
                           typed_at_ms: int | None = None, generation: str | None = None,
                           origin: str | None = None, notify: bool = True) -> ControlOutcome:
        """Send ``action`` (interrupt, kill, eof, screen) to the follower generation live now, or explain
        why not (in the topic when ``notify``; a button answers its callback query instead).
        ``typed_at_ms``: when the owner asked (a message's date); older than :data:`CONTROL_TTL_MS`,
        or before the live follower registered, and it is not sent. ``generation``: send only if
        this registration generation is still the live one (a button on output of an earlier process
        must not reach its successor). ``origin`` makes the delivery id (``c-<origin>``)."""
        if action not in CONTROL_ACTIONS:
            raise ValueError(f"unknown control action {action!r}")
        outcome = await self._send(binding_key, action, message_id, typed_at_ms, generation, origin)
        log = logger.bind(phase="control")
        if outcome.sent:
            self.sent += 1
            log.info("/{} sent to the agent of {}", action, binding_key)
            if action == "kill" and notify:  # follow waits TERMINATE_GRACE_S: say so now, not in 5 s
                await self._notices.post(binding_key, KILL_SENT_TEXT)
        else:
            log.info("/{} not sent to the agent of {} ({})", action, binding_key, outcome.reason)
            if notify:
                await self._notices.post(binding_key, outcome.text)
        return outcome

    async def _send(self, binding_key: str, action: str, message_id: int | None, typed_at_ms: int | None,
                    generation: str | None, origin: str | None) -> ControlOutcome:
        command = f"/{action}"
        now = self._clock.now_ms()
        if typed_at_ms is not None and now - typed_at_ms > CONTROL_TTL_MS + CLOCK_SLACK_MS:
            return ControlOutcome(False, "expired", f"⌛ {command} was not sent: you typed it {age_text(now - typed_at_ms)} "
                                  f"ago, and commands are only sent within {CONTROL_TTL_MS // 1000} s.")
        record = self._router.live_follower(binding_key)
        if record is None:
            return ControlOutcome(False, "offline", f"⏸ {command} was not sent: this agent is offline. Commands are "
                                  "never kept for a later process; send it again when the agent is back.")
        if CAP_CONTROL not in record.capabilities:
            return ControlOutcome(False, "unsupported", f"{command} was not sent: this agent's follower does not take "
                                  "commands (it is an older version, or its program does not handle them).")
        if action == "screen" and CAP_SCREEN not in record.capabilities:
            return ControlOutcome(False, "unsupported", "🖥 /screen has no screen to show: this agent does not run on a "
                                  "terminal. Only an agent started with topicbus follow --pty can send a picture of it.")
        if (generation is not None and generation != record.registration_generation) or (
                typed_at_ms is not None and record.connected_at_ms > typed_at_ms + CLOCK_SLACK_MS):
            return ControlOutcome(False, "earlier-process", f"{command} was not sent: the agent registered after you "
                                  "typed it, so it was meant for an earlier process. Send it again if you mean this one.")
        delivery_id = f"c-{origin or self._new_id()}"
        sent = await self._delivery.send_now(binding_key, record.instance_id, record.registration_generation,
                                             delivery_id, ControlItem(action, message_id))
        if not sent:
            return ControlOutcome(False, "offline", f"⏸ {command} was not sent: the agent's connection just dropped. "
                                  "Send it again when the agent is back.")
        return ControlOutcome(True)
