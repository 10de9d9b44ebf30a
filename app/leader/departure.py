"""What happens to the topic of a follower that is gone for good.

* **Cleanup after a grace period** (policy on; graceful disconnect or proven death; docs/operations.md, "Cleanup policy"): the
  topic stays readable for ``TOPICBUS_CLEANUP_GRACE_S`` (default 600 s). The owner record is
  detached and the binding stamped inactive at once (as preservation does), a
  :class:`~topicbus.storage.cleanups.ScheduledCleanup` is written, and after a proven death the
  topic gets ``⏹ process ended`` behind its pending output. When the time is up and nobody took the
  workspace back (a registration of the same workspace keeps the topic), and once every pending
  output row of the topic went out, the cleanup below runs. Slot rotation may retire such a topic
  earlier when every slot is taken: a scheduled cleanup does not protect its slot.
* **Cleanup** (the grace is 0 and nothing is left to send, ``/forget``, or a scheduled cleanup that
  fell due): durable intent first, then close and
  delete the topic, then mark the binding's topic deleted and the binding inactive, then drop the
  intent. An unconfirmed deletion keeps the intent and the binding and says so.
* **Preservation** (policy off; proven death): detach the routeable owner record and stamp the
  binding inactive in one transaction. Zero Telegram calls. Idempotent across retries.
* **Replay** at leader start: pending intents of a previous leader are finished before followers
  can connect; intents whose binding has been taken over since are cancelled without Telegram calls.

:class:`Departures` is the one place that decides between the two for a graceful disconnect and an
operator's ``/forget`` (the pruner decides for proven deaths, reference §4.5), and the one lock
order every departure takes: admission hold, then the follower's mutation queue.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from topicbus.ports.store import Admission, Store
from topicbus.core.clock import Clock
from topicbus.logsetup import EventJournal
from topicbus.core.telegram import CallOutcome
from topicbus.core.mutations import FollowerMutationQueue, follower_mutation_key
from topicbus.core.registry import FollowerRecord
from topicbus.core.startup import Timers
from topicbus.leader.notices import Notices
from topicbus.leader.outbound import ScheduledGateway
from topicbus.leader.preferences import Preferences
from topicbus.leader.roster import Roster
from topicbus.leader.term import LeaderTerm, TermTasks, new_operation_id
from topicbus.core.admission import PROFILE
from topicbus.core.cleanups import CleanupIntent, ScheduledCleanup
from topicbus.core.authority import Authority

PROCESS_ENDED = "⏹ process ended"  # after a proven death; follow itself posts the exit code when it survives
DRAIN_RECHECK_S = 1.0  # a due cleanup whose topic still has output to send looks again after this

T = TypeVar("T")


class CleanupUnconfirmed(Exception):
    """Telegram did not confirm the deletion; the intent and the binding are kept."""


class DepartureHandler:
    """The two departures' mechanics: durable steps and Telegram calls, no policy."""

    def __init__(self, term: LeaderTerm, gateway: ScheduledGateway, *, store: Store, clock: Clock,
                 events: EventJournal):
        self._term = term
        self._store = store
        self._clock = clock
        self._events = events
        self._gateway = gateway
        self._bindings = store.bindings
        self._cleanups = store.cleanups

    # --- cleanup (delete) -------------------------------------------------------------------------
    async def cleanup(self, follower: FollowerRecord, authority: Authority, *, reason: str) -> bool:
        """Delete the follower's topic; True when deleted (or already gone), False when superseded."""
        target = follower.target
        if target is None or target.thread_id is None or follower.binding_key is None:
            return False
        if not follower.registration_generation:
            raise CleanupUnconfirmed("Follower cleanup requires an exact registration generation.")
        intent = CleanupIntent(
            id=CleanupIntent.make_id(follower.instance_id, follower.registration_generation, target.chat_id,
                                     target.thread_id),
            binding_key=follower.binding_key, instance_id=follower.instance_id,
            registration_generation=follower.registration_generation, chat_id=target.chat_id,
            thread_id=target.thread_id, reason=reason, requested_at_ms=self._clock.now_ms(),
        )
        async with self._store.unit_of_work(authority) as uow:
            await uow.cleanups.upsert(intent)
        return await self.apply(intent, authority)

    async def apply(self, intent: CleanupIntent, authority: Authority) -> bool:
        """Carry out one durable intent (also used for replay)."""
        events = self._events
        if await self._superseded(intent):
            await self._keep_open(intent, authority)
            async with self._store.unit_of_work(authority) as uow:
                await uow.cleanups.remove(intent.id)
            events.record("Cleanup intent superseded by a newer owner; topic kept",
                          phase="cleanup-superseded", intentId=intent.id, threadId=intent.thread_id)
            return False
        closed = await self._gateway.close_topic(intent.target)
        if closed.outcome in (CallOutcome.AMBIGUOUS, CallOutcome.RETRY_AFTER):
            await self._unconfirmed(intent, authority, f"close: {closed.outcome} {closed.message}")
        if closed.ok:  # closed, not yet deleted: a binding reused before the delete reopens it first
            await self._note_closed(intent, authority)
        deleted = await self._gateway.delete_topic(intent.target)
        if deleted.outcome not in (CallOutcome.OK, CallOutcome.GONE):
            await self._unconfirmed(intent, authority, f"delete: {deleted.outcome} {deleted.message}")
        async with self._store.unit_of_work(authority) as uow:
            await uow.bindings.mark_topic_deleted(intent.target, self._clock.now_ms())
            await uow.cleanups.remove(intent.id)
        events.record("Follower topic cleaned up", phase="follower-confirmed-dead-cleanup"
                      if intent.reason == "confirmed-dead" else "follower-disconnect",
                      instanceId=intent.instance_id, chatId=intent.chat_id, threadId=intent.thread_id)
        return True

    async def _note_closed(self, intent: CleanupIntent, authority: Authority) -> None:
        async with self._store.unit_of_work(authority) as uow:
            binding = await uow.bindings.get(intent.binding_key)
            if binding is not None and binding.thread_id == intent.thread_id and binding.topic_state == "open":
                await uow.bindings.set_topic_state(intent.binding_key, "closed")

    async def _keep_open(self, intent: CleanupIntent, authority: Authority) -> None:
        """A cancelled cleanup leaves its topic open: when this intent closed it (its delete failed
        afterwards, or the store says closed), it is reopened for the binding that kept it."""
        binding = await self._bindings.get(intent.binding_key)
        if binding is None or binding.thread_id != intent.thread_id:
            return
        if binding.topic_state != "closed" and not (intent.last_error or "").startswith("delete:"):
            return
        reopened = await self._gateway.reopen_topic(intent.target)
        self._events.record("Reopened the topic of a cancelled cleanup", phase="topic-reopen",
                                 threadId=intent.thread_id, outcome=str(reopened.outcome))
        if reopened.ok and binding.topic_state == "closed":
            async with self._store.unit_of_work(authority) as uow:
                await uow.bindings.set_topic_state(intent.binding_key, "open")
        elif reopened.outcome is CallOutcome.GONE:  # deleted after all: the next registration gets a new topic
            async with self._store.unit_of_work(authority) as uow:
                await uow.bindings.mark_topic_deleted(intent.target, self._clock.now_ms())

    async def _superseded(self, intent: CleanupIntent) -> bool:
        binding = await self._bindings.get(intent.binding_key)
        if binding is None or binding.thread_id != intent.thread_id or binding.topic_state == "deleted":
            return False  # nothing newer holds this topic; deleting a gone topic is confirmed absence
        owner = await self._bindings.owner(intent.binding_key)
        return owner is not None and (owner.instance_id, owner.registration_generation) != (
            intent.instance_id, intent.registration_generation)

    async def _unconfirmed(self, intent: CleanupIntent, authority: Authority, error: str) -> None:
        async with self._store.unit_of_work(authority) as uow:
            await uow.cleanups.note_error(intent.id, error)
        raise CleanupUnconfirmed(
            "Follower topic deletion was not confirmed; the cleanup intent is kept and retried by the next "
            f"leader start ({error}).")

    async def replay(self, authority: Authority) -> tuple[int, int]:
        """Finish every pending intent; returns (completed, still pending)."""
        done = failed = 0
        for intent in await self._cleanups.all():
            try:
                await self.apply(intent, authority)
                done += 1
            except CleanupUnconfirmed as exc:
                failed += 1
                self._events.record(exc, phase="cleanup-replay", level="WARNING", intentId=intent.id)
        return done, failed

    # --- preservation (detach, keep the topic) -------------------------------------------------------
    async def preserve(self, follower: FollowerRecord, is_detached: Callable[[], bool],
                       authority: Authority) -> bool:
        """Detach the exact owner record and stamp the binding inactive; True when settled."""
        if follower.binding_key is None or not follower.registration_generation:
            return False
        if not is_detached():
            return False
        async with self._store.unit_of_work(authority) as uow:
            owner = await uow.bindings.owner(follower.binding_key)
            if owner is None or (owner.instance_id, owner.registration_generation) != (
                    follower.instance_id, follower.registration_generation):
                return True  # nothing of ours left to detach: settled
            if not is_detached():  # authority, replacement and death re-checked at the commit
                return False
            await uow.bindings.detach_owner(owner)
            await uow.bindings.mark_inactive(follower.binding_key, self._clock.now_ms())
        return True


class ScheduledCleanups:
    """Finished agents' topics kept readable for their grace period, then deleted if nobody took
    the workspace back — never before the topic's output went out (docs/operations.md, "Cleanup policy")."""

    def __init__(self, term: LeaderTerm, handler: DepartureHandler, admission: Admission, timers: Timers,
                 notices: Notices, on_roster_change: Callable[[], None], *, grace_ms: int, store: Store, clock: Clock,
                 events: EventJournal, new_id: Callable[[], str] = new_operation_id, tasks: TermTasks):
        self._term = term
        self._store = store
        self._clock = clock
        self._events = events
        self._new_id = new_id
        self._tasks = tasks
        self._handler = handler
        self._admission = admission
        self._timers = timers
        self._notices = notices
        self._on_roster_change = on_roster_change
        self.grace_ms = max(0, grace_ms)
        self._repo = store.scheduled_cleanups
        self._bindings = store.bindings
        self._outbox = store.outbox
        self._waiting_for_output: set[str] = set()  # logged once per cleanup held back by output

    async def depart(self, follower: FollowerRecord, authority: Authority, *, reason: str,
                     notice: str | None = None) -> None:
        """Cleanup is on and ``follower`` is gone (graceful disconnect or proven death); runs inside
        the departure's admitted operation. With no grace and nothing left to send, the topic is
        deleted at once (the reference's path); otherwise the cleanup is scheduled."""
        target = follower.target
        if target is None or target.thread_id is None or follower.binding_key is None:
            return
        if not follower.registration_generation:
            raise CleanupUnconfirmed("Follower cleanup requires an exact registration generation.")
        if self.grace_ms == 0 and await self._outbox.pending_in(target) == 0:
            await self._handler.cleanup(follower, authority, reason=reason)
            return
        now = self._clock.now_ms()
        scheduled = ScheduledCleanup(
            binding_key=follower.binding_key, instance_id=follower.instance_id,
            registration_generation=follower.registration_generation, chat_id=target.chat_id,
            thread_id=target.thread_id, reason=reason, requested_at_ms=now, due_at_ms=now + self.grace_ms)
        async with self._store.unit_of_work(authority) as uow:
            owner = await uow.bindings.owner(follower.binding_key)
            if owner is not None:
                if (owner.instance_id, owner.registration_generation) != (
                        follower.instance_id, follower.registration_generation):
                    return  # a newer registration holds the workspace: its topic stays
                await uow.bindings.detach_owner(owner)
            await uow.bindings.mark_inactive(follower.binding_key, now)
            await uow.scheduled_cleanups.put(scheduled)
        if notice is not None and self.grace_ms > 0:  # with no grace the topic is about to go: no notice
            await self._notices.post(follower.binding_key, notice, authority=authority)
        self._events.record("Topic kept for its grace period", phase="cleanup-scheduled",
                                 instanceId=follower.instance_id, chatId=target.chat_id, threadId=target.thread_id,
                                 graceS=self.grace_ms / 1000, reason=reason)
        self._arm(scheduled.binding_key, self.grace_ms / 1000)

    def resume(self) -> None:
        """At the start of a term: arm every scheduled cleanup of earlier terms (due ones at once)."""
        self._tasks.spawn(self._resume())

    async def _resume(self) -> None:
        now = self._clock.now_ms()
        for scheduled in await self._repo.all():
            self._arm(scheduled.binding_key, max(0, scheduled.due_at_ms - now) / 1000)

    async def pending(self) -> list[ScheduledCleanup]:
        return await self._repo.all()

    async def run_due(self) -> int:
        """Run every cleanup whose time is up (the timers call this; so may a test with its own
        clock). Returns how many topics were deleted."""
        deleted = 0
        now = self._clock.now_ms()
        for scheduled in await self._repo.all():
            if scheduled.due_at_ms <= now:
                deleted += await self._run(scheduled.binding_key)
        return deleted

    async def expedite(self, binding_key: str) -> int | None:
        """``/forget`` on a topic in its grace period: the cleanup runs now (its output still goes
        first). None when no cleanup is scheduled for ``binding_key``."""
        if await self._repo.get(binding_key) is None:
            return None
        return await self._run(binding_key, now=True)

    def _arm(self, binding_key: str, delay_s: float) -> None:
        async def fire() -> None:
            try:
                await self._run(binding_key)
            except Exception as exc:  # noqa: BLE001 - a timer callback must not raise into the job queue
                self._events.record(exc, phase="cleanup-scheduled", level="ERROR", bindingKey=binding_key)
                self._arm(binding_key, DRAIN_RECHECK_S * 10)

        self._timers.once(f"topicbus.cleanup:{binding_key}", delay_s, fire)

    async def _run(self, binding_key: str, *, now: bool = False) -> int:
        authority = self._term.current()
        if authority is None:
            return 0  # this term is over; the next leader resumes the schedule
        deleted = await self._admission.run(self._new_id(), "workspace.cleanup-after-grace", [PROFILE],
                                            lambda: self._due(binding_key, authority, now=now))
        if deleted:
            self._on_roster_change()
        return deleted

    async def _due(self, binding_key: str, authority: Authority, *, now: bool) -> int:
        scheduled = await self._repo.get(binding_key)
        if scheduled is None:
            return 0
        if not now and scheduled.due_at_ms > self._clock.now_ms():
            # Re-scheduled by a later departure (or the timer fired early): wait for the rest.
            self._arm(binding_key, (scheduled.due_at_ms - self._clock.now_ms()) / 1000)
            return 0
        binding = await self._bindings.get(binding_key)
        owner = await self._bindings.owner(binding_key)
        if (binding is None or owner is not None or binding.thread_id != scheduled.thread_id
                or binding.topic_state == "deleted"):
            # The workspace came back (same topic, kept), or rotation retired the topic earlier.
            async with self._store.unit_of_work(authority) as uow:
                await uow.scheduled_cleanups.remove(binding_key)
            self._waiting_for_output.discard(binding_key)
            self._events.record("Scheduled cleanup dropped: the topic is in use again or already gone",
                                     phase="cleanup-kept", chatId=scheduled.chat_id, threadId=scheduled.thread_id)
            return 0
        pending = await self._outbox.pending_in(scheduled.target)
        if pending:
            if binding_key not in self._waiting_for_output:
                self._waiting_for_output.add(binding_key)
                self._events.record("Cleanup waits until the topic's output went out", phase="cleanup-drain",
                                         chatId=scheduled.chat_id, threadId=scheduled.thread_id, pending=pending)
            self._arm(binding_key, DRAIN_RECHECK_S)
            return 0
        self._waiting_for_output.discard(binding_key)
        intent = scheduled.intent()
        async with self._store.unit_of_work(authority) as uow:
            await uow.cleanups.upsert(intent)  # durable intent before any Telegram call
            await uow.scheduled_cleanups.remove(binding_key)
        try:
            return int(await self._handler.apply(intent, authority))
        except CleanupUnconfirmed as exc:
            self._events.record(exc, phase="cleanup-scheduled", level="WARNING", intentId=intent.id)
            return 0


class Departures:
    """When a follower is gone for good: admission, then its mutation queue, then the departure."""

    def __init__(self, term: LeaderTerm, roster: Roster, preferences: Preferences, admission: Admission,
                 mutations: FollowerMutationQueue, handler: DepartureHandler, scheduled: ScheduledCleanups,
                 on_roster_change: Callable[[], None], *, new_id: Callable[[], str] = new_operation_id):
        self._term = term
        self._new_id = new_id
        self.scheduled = scheduled
        self._roster = roster
        self._preferences = preferences
        self._admission = admission
        self._mutations = mutations
        self.handler = handler
        self._on_roster_change = on_roster_change

    async def _admitted(self, operation_id: str, kind: str, record: FollowerRecord,
                        op: Callable[[], Awaitable[T]]) -> T:
        return await self._admission.run(operation_id, kind, [PROFILE],
                                         lambda: self._mutations.run(follower_mutation_key(record), op))

    async def _depart(self, record: FollowerRecord, authority: Authority, reason: str, *, grace: bool) -> bool:
        """The one cleanup-or-preserve decision: policy on → delete the topic (after its grace period
        when ``grace``); otherwise keep it and detach (an unknown policy never deletes). Returns True
        when cleanup was chosen."""
        if await self._preferences.cleanup_policy() is True:
            if grace:
                await self.scheduled.depart(record, authority, reason=reason)
            else:
                await self.handler.cleanup(record, authority, reason=reason)
            return True
        await self.handler.preserve(record, lambda: self._term.is_current(authority), authority)
        return False

    async def disconnect(self, record: FollowerRecord, still_registered: Callable[[], FollowerRecord]) -> None:
        """A graceful disconnect runs the same path as a confirmed death (reference §4.2)."""
        async def op() -> None:
            current = still_registered()
            authority = self._term.authority()
            try:
                await self._depart(current, authority, "disconnect", grace=True)
            finally:
                self._roster.drop(current.instance_id)
                self._on_roster_change()

        await self._admitted(self._new_id(), "workspace.disconnect-follower", record, op)

    async def confirmed_dead(self, record: FollowerRecord, is_detached: Callable[[], bool]) -> None:
        """The pruner proved the process dead on a fresh attempt with cleanup on: ``⏹ process ended``
        behind the topic's output, then delete after the grace period."""
        authority = self._term.authority()

        async def op() -> None:
            if is_detached():
                await self.scheduled.depart(record, authority, reason="confirmed-dead", notice=PROCESS_ENDED)

        try:
            await self._admitted(self._new_id(), "workspace.cleanup-dead-follower", record, op)
        finally:
            self._roster.forget_connection(record.instance_id)
        self._on_roster_change()

    async def confirmed_dead_preserved(self, record: FollowerRecord, is_detached: Callable[[], bool],
                                       operation_id: str) -> bool:
        """The pruner proved the process dead with cleanup off: detach and keep the topic. The
        observation's operation id is reused across retries, so a lost acknowledgement never
        leaves a second hold or a second inactivity stamp."""
        authority = self._term.current()
        if authority is None:
            return False

        def current() -> bool:
            return is_detached() and self._term.is_current(authority)

        if not current():
            return False
        settled = await self._admitted(operation_id, "workspace.preserve-dead-follower", record,
                                       lambda: self.handler.preserve(record, current, authority))
        if settled:
            self._roster.forget_connection(record.instance_id)
            self._on_roster_change()
        return settled

    async def forget(self, record: FollowerRecord) -> bool:
        """Operator proof that the follower is gone (``/forget``); True when its topic was deleted
        (at once: the operator asked), False when it was kept and detached."""
        authority = self._term.authority()
        deleted = await self._admitted(self._new_id(), "workspace.forget-follower", record,
                                       lambda: self._depart(record, authority, "operator-forget", grace=False))
        self._on_roster_change()
        return deleted
