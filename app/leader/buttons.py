"""Presses of the inline buttons under the leader's messages (docs/architecture.md, "A button press").

``handlers/buttons`` hands every ``callback_query`` to :meth:`ButtonPresses.press`. The press is
decided here, against the keyboard the outbound scheduler stored (``leader/keyboards``):

* **strangers** (anyone but an owner) get an alert (at most one a minute), and nothing changes;
* **stale presses** get an alert and change nothing: data that is not ours, a keyboard the bot no
  longer knows, a press from another chat or another message than the one the keyboard went out
  on, a follower's buttons whose message was answered already, buttons of an earlier process
  (another follower process holds the topic now, or the process that sent them has ended: its
  binding no longer names it), an Interrupt button of a registration that is no longer the live one;
* a follower's buttons (a **choice**) when the follower does not take presses (no ``button-v1``):
  an alert that says so; nothing is journaled;
* a valid press on a follower's buttons: in **one transaction**, the keyboard is marked answered by
  this press and a ``button`` item (``data``, ``messageId``, ``fromUserId``) is journaled for that
  follower process only (``for_instance``). So it is delivered exactly once: a second press on the
  message finds it answered, and the same update fetched again after a leader crash (its
  ``update_id`` is journaled) finds it answered *by itself* and only repeats the answer. The row is
  delivered like an owner message (at-least-once, the follower drops duplicates by ``deliveryId``),
  also after that process reconnects; a successor never gets it (it is settled ``skipped``). Then
  the query is answered, and the message is edited to show the choice with its buttons removed;
* a valid press of the **Interrupt** button: ``interrupt`` through
  :meth:`~topicbus.leader.agent_commands.AgentCommands.send_control`, only to the registration
  generation that printed the message; the answer says whether it went.

Telegram is never called on the poll loop's path. Each press gets at most one answer, queued in
the press-answer lane (``leader/press_answers``, decided by ``core/press_answers``): beside the
outbound scheduler, so output never waits behind presses; merged per user and button; a stranger
alerted at most once a minute and otherwise not answered; an answer past Telegram's deadline
(about 15 s after the update arrived) dropped. The edit that shows the choice goes through the
outbound scheduler at ANSWER priority as a spend. An edit that did not happen before a crash is
made when the next term starts (:meth:`ButtonPresses.resume`).
"""

from __future__ import annotations

from dataclasses import dataclass

from loguru import logger

from topicbus.ports.store import Store, UnitOfWork
from topicbus.core.clock import Clock
from topicbus.core.telegram import CallOutcome
from topicbus.core.formatting import MAX_MESSAGE, Rendered
from topicbus.core.press_answers import Offer
from topicbus.core.records import Button, ButtonItem
from topicbus.leader.agent_commands import AgentCommands
from topicbus.leader.keyboards import parse_callback
from topicbus.leader.outbound import ScheduledGateway
from topicbus.leader.press_answers import PressAnswerLane
from topicbus.leader.routing import InboundBatch, Router
from topicbus.leader.term import LeaderTerm, TermTasks
from topicbus.protocol import CAP_BUTTON
from topicbus.core.authority import AuthorityLost
from topicbus.core.keyboards import INTERRUPT, Keyboard

RESUME_WINDOW_MS = 24 * 3600 * 1000  # answered keyboards whose edit is still owed, at a term's start

STRANGER = "Only the owners of this bot can use its buttons."
STALE = "⌛ This button no longer works: the bot does not know it any more. Nothing was sent."
ALREADY = "Already answered: {label}. Nothing more was sent."
EARLIER_PROCESS = "⌛ These buttons belong to an earlier run of this agent. Nothing was sent to the one running now."
ENDED = "⌛ The program that asked has ended. Nothing was sent."
CANNOT_TAKE = "This agent cannot take button presses (its follower does not handle them). Nothing was sent."
SENT = "Sent to the agent: {label}"
KEPT_OFFLINE = "The agent is offline: it gets “{label}” when it reconnects."
INTERRUPTED = "✋ Interrupt sent to the agent."
INTERRUPT_REFUSED = {
    "offline": "⏸ The agent is offline: nothing was interrupted.",
    "unsupported": "This agent does not take commands: nothing was interrupted.",
    "earlier-process": ("⌛ This button is on output of an earlier run of the agent (or from before it reconnected): "
                        "nothing was interrupted. Use /interrupt, or the button on newer output."),
    "expired": "⌛ This button is too old: nothing was interrupted. Use /interrupt.",
}
CHOICE_MARK = "👉"
TURN_OUTCOMES = frozenset({"sent", "interrupted"})  # presses that reached the agent: the owner's turn


@dataclass(frozen=True)
class Press:
    """One ``callback_query`` as the leader needs it (built by ``handlers/buttons``)."""

    update_id: int
    query_id: str
    user_id: int
    chat_id: int | None
    thread_id: int | None
    message_id: int | None
    data: str | None
    message: Rendered | None = None  # the pressed message as it reads now (text and entities)
    arrived_at: float | None = None  # when its update reached the leader (the lane's clock); None: its batch's


@dataclass(frozen=True)
class Verdict:
    """What became of a press, and the answer its presser gets."""

    outcome: str
    text: str
    alert: bool = False


def with_choice(message: Rendered | None, label: str) -> Rendered | None:
    """The pressed message with the choice under it; None when that would not fit in a message
    (or the message has no text): then only its buttons are removed."""
    if message is None or not message.text or message.parse_mode is not None:
        return None
    shown = Rendered(f"{message.text}\n\n{CHOICE_MARK} {label}", message.entities)
    return shown if shown.length <= MAX_MESSAGE else None


class ButtonPresses:
    def __init__(self, term: LeaderTerm, router: Router, commands: AgentCommands, gateway: ScheduledGateway,
                 answers: PressAnswerLane, *, store: Store, clock: Clock, tasks: TermTasks):
        self._term = term
        self._clock = clock
        self._tasks = tasks
        self._router = router
        self._commands = commands
        self._gateway = gateway
        self._answers = answers
        self._keyboards = store.keyboards
        self._bindings = store.bindings
        self._showing: set[str] = set()  # keyboards whose choice is being shown now
        self.outcomes: dict[str, int] = {}

    async def press(self, press: Press, *, by_owner: bool, batch: InboundBatch | None = None) -> str:
        """Serve one press; returns what became of it (``sent``, ``kept``, ``repeat``, ``interrupted``,
        ``stranger``, ``stale``, ``answered``, ``earlier-process``, ``ended``, ``cannot-take``, or the
        reason an interrupt was not sent). ``batch``: the ``getUpdates`` answer it came in (its age
        dates the press; what the owner sent before it there is journaled first)."""
        arrived_at = press.arrived_at
        if arrived_at is None:
            arrived_at = self._answers.now() - (batch.age_s() if batch is not None else 0.0)
        verdict = await self._decide(press, by_owner, batch)
        self.outcomes[verdict.outcome] = self.outcomes.get(verdict.outcome, 0) + 1
        offer = self._answer(press, verdict, by_owner=by_owner, arrived_at=arrived_at)
        # A press whose answer was merged away or not given (a stranger's storm) is logged at DEBUG only.
        level = "INFO" if offer in (Offer.QUEUED, None) else "DEBUG"
        logger.bind(phase="button").log(level, "button press {} by {}: {} (answer {})", press.update_id,
                                        "an owner" if by_owner else "a stranger", verdict.outcome,
                                        offer or "none")
        return verdict.outcome

    async def _decide(self, press: Press, by_owner: bool, batch: InboundBatch | None) -> Verdict:
        if not by_owner:
            return Verdict("stranger", STRANGER, alert=True)
        parsed = parse_callback(press.data)
        keyboard = await self._keyboards.get(parsed[0]) if parsed is not None else None
        button = keyboard.button(parsed[1]) if keyboard is not None and parsed is not None else None
        if (keyboard is None or button is None or press.chat_id != keyboard.chat_id
                or (keyboard.message_id is not None and press.message_id != keyboard.message_id)):
            return Verdict("stale", STALE, alert=True)
        assert parsed is not None
        if keyboard.kind == INTERRUPT:
            return await self._interrupt(press, keyboard)
        return await self._choose(press, keyboard, parsed[1], button, batch)

    # --- a follower's buttons ---------------------------------------------------------------------
    async def _choose(self, press: Press, keyboard: Keyboard, index: int, button: Button,
                      batch: InboundBatch | None) -> Verdict:
        label = button.text
        if keyboard.answered:
            return await self._answered_before(press, keyboard)
        record = self._router.live_follower(keyboard.binding_key)
        if record is not None and record.instance_id != keyboard.instance_id:
            return Verdict("earlier-process", EARLIER_PROCESS, alert=True)
        if record is None:
            # Offline. The process may still come back (a leader restart, a network gap) only while the
            # binding's owner record names it: a departure (its exit, a proven death) removes that.
            owner = await self._bindings.owner(keyboard.binding_key)
            if owner is None or owner.instance_id != keyboard.instance_id:
                return Verdict("ended", ENDED, alert=True)
        takes = CAP_BUTTON in record.capabilities if record is not None else keyboard.takes_presses
        if takes is False:
            return Verdict("cannot-take", CANNOT_TAKE, alert=True)
        shown = with_choice(press.message, label)
        item = ButtonItem(button.data, press.message_id, press.user_id)

        async def claim(uow: UnitOfWork) -> bool:
            return await uow.keyboards.claim(keyboard.token, update_id=press.update_id, index=index,
                                             user_id=press.user_id, now_ms=self._clock.now_ms(),
                                             message_id=press.message_id, shown=shown)

        journaled = await self._router.route_bound(press.update_id, keyboard.binding_key, item,
                                                   for_instance=keyboard.instance_id, claim=claim, batch=batch)
        if journaled is None:  # answered in between (or this very update journaled before)
            current = await self._keyboards.get(keyboard.token)
            return await self._answered_before(press, current or keyboard)
        online = record is not None
        self._show_later(keyboard.token)
        return Verdict("sent" if online else "kept", (SENT if online else KEPT_OFFLINE).format(label=label))

    async def _answered_before(self, press: Press, keyboard: Keyboard) -> Verdict:
        chosen = keyboard.button(keyboard.answered_index)
        label = chosen.text if chosen is not None else "?"
        if keyboard.shown_at_ms is None:
            self._show_later(keyboard.token)  # the edit that shows the choice has not happened yet
        if keyboard.answered_update_id == press.update_id:  # the same press, fetched again after a crash
            return Verdict("repeat", SENT.format(label=label))
        return Verdict("answered", ALREADY.format(label=label), alert=True)

    # --- the Interrupt button -----------------------------------------------------------------------
    async def _interrupt(self, press: Press, keyboard: Keyboard) -> Verdict:
        outcome = await self._commands.send_control(keyboard.binding_key, "interrupt", message_id=press.message_id,
                                                    generation=keyboard.registration_generation,
                                                    origin=f"q{press.update_id}", notify=False)
        if outcome.sent:
            return Verdict("interrupted", INTERRUPTED)
        return Verdict(outcome.reason, INTERRUPT_REFUSED.get(outcome.reason, outcome.text), alert=True)

    # --- Telegram, in the background ----------------------------------------------------------------
    def _answer(self, press: Press, verdict: Verdict, *, by_owner: bool, arrived_at: float) -> Offer | None:
        if press.chat_id is None:
            return None  # a press on an inline-mode message: never ours
        return self._answers.offer((press.user_id, press.chat_id, press.message_id, press.data), press.query_id,
                                   verdict.text, alert=verdict.alert, by_owner=by_owner, arrived_at=arrived_at)

    def _show_later(self, token: str) -> None:
        if token not in self._showing:
            self._showing.add(token)
            self._tasks.spawn(self._show(token))

    async def _show(self, token: str) -> None:
        try:
            await self._show_choice(token)
        finally:
            self._showing.discard(token)

    async def _show_choice(self, token: str) -> None:
        """Edit the answered message: the choice under its text, the buttons gone (once)."""
        keyboard = await self._keyboards.get(token)
        if keyboard is None or keyboard.shown_at_ms is not None or keyboard.message_id is None:
            return
        chosen = keyboard.shown_text
        result = await self._gateway.show_choice(keyboard.target, keyboard.message_id, chosen)
        if result.outcome is CallOutcome.REJECTED and chosen is not None:
            # Telegram would not take the text back (entities it refuses): remove the buttons at least.
            result = await self._gateway.show_choice(keyboard.target, keyboard.message_id, None)
        if result.ok or result.outcome in (CallOutcome.REJECTED, CallOutcome.GONE):  # done, or nothing more can be done
            try:
                await self._keyboards.mark_shown(token, self._clock.now_ms(), self._term.authority())
            except AuthorityLost:
                return
        else:
            logger.bind(phase="button").info("the choice is not shown yet ({}); the next press or term retries",
                                             result.outcome)

    async def resume(self) -> int:
        """A new term: show the choice on messages answered before a crash and not edited yet."""
        pending = await self._keyboards.unshown(self._clock.now_ms() - RESUME_WINDOW_MS)
        for keyboard in pending:
            self._show_later(keyboard.token)
        return len(pending)
