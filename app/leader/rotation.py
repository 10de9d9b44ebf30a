"""Workspace slot rotation: free a letter by retiring the binding that has been inactive longest.

When a registration needs a new slot and all 26 letters are taken, :class:`SlotRotation` (the
capacity runner) retires exactly one *eligible* binding — no live owner, no accepted work, no
delivery route, and a durable inactivity proof — and retries the registration exactly once.

The retirement is a durable, fenced lifecycle that survives a crash at any step:

1. **intent** — the exact victim binding is written down (``retirement_intents``);
2. **fence** — the admission ledger's single retirement fence excludes every other workspace operation;
3. **permit** — phase ``deletion-issued`` is recorded *before* the one ``deleteForumTopic``;
4. **outcome** — deleted or already absent → ``commit-ready``; a proven Telegram rejection →
   ``deletion-rejected`` → cancelled, binding kept; ambiguous (timeout, 5xx) → stays fenced;
5. **commit** — binding, intent and fence removed in one transaction.

Every decision is the pure :func:`topicbus.core.retirement.next_step`; this module is its thin
executor: observe the store, ask for one action, perform it, observe again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from topicbus.ports.store import Admission, Store
from topicbus.logsetup import EventJournal
from topicbus.core.clock import Clock
from topicbus.core.telegram import CallOutcome
from topicbus.leader.outbound import ScheduledGateway
from topicbus.core.retirement import (AcquireFence, AdoptFence, Cancel, Commit, DeleteTopic, DeletionAnswer,
                                      DropIntent, FenceView, Finish, IntentView, IssueDeletion, MarkCommitReady,
                                      MarkRejected, PrepareIntent, ProbeTopic, RemoveFence, RestampIntent,
                                      RetirementState, RotationResult, next_step)
from topicbus.core.status import FenceStatus, IntentStatus, RotationCandidate, RotationStatus
from topicbus.core.target import Target
from topicbus.leader.provisioning import SlotUnavailable
from topicbus.leader.occupancy import SlotOccupancy
from topicbus.leader.term import LeaderTerm, new_operation_id
from topicbus.core.admission import Fence
from topicbus.core.bindings import Binding
from topicbus.core.authority import Authority
from topicbus.core.retirement import RetirementIntent

T = TypeVar("T")
MAX_STEPS = 32  # one retirement takes about ten; more means a bug, and the rotation retains (fails closed)


class RotationBlocked(Exception):
    """No slot can be freed now; the message says why."""


class SimulatedCrash(Exception):
    """Raised by a test's checkpoint hook to stop a rotation at one step, as a SIGKILL would."""


class SlotRotation:
    def __init__(self, *, term: LeaderTerm, occupancy: SlotOccupancy, admission: Admission, gateway: ScheduledGateway,
                 gate: asyncio.Lock, checkpoint: Callable[[str], Awaitable[None] | None] = lambda step: None,
                 store: Store, clock: Clock, events: EventJournal, new_id: Callable[[], str] = new_operation_id):
        self._term = term
        self._store = store
        self._clock = clock
        self._new_id = new_id
        self._occupancy = occupancy
        self._admission = admission
        self._gateway = gateway
        self._events = events
        self._gate = gate  # the provisioner's gate: no slot is claimed while a retirement runs
        self._runner_gate = asyncio.Lock()
        self._bindings = store.bindings
        self._intents = store.retirements
        self.checkpoint = checkpoint
        self.retired = 0

    async def _checkpoint(self, step: str) -> None:
        """A test hook between durable steps (a simulated crash, or a change made at that moment)."""
        result = self.checkpoint(step)
        if result is not None:
            await result

    # --- the capacity runner ----------------------------------------------------------------------
    async def run(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run a slot-consuming operation; on slot pressure rotate once and retry exactly once."""
        async with self._runner_gate:
            if await self._unfinished():
                # Finish (or give up on) an interrupted retirement first; whatever it says, the
                # operation then runs once (a fence that is still there blocks it by admission).
                await self.rotate(recovery=True)
            try:
                return await operation()
            except SlotUnavailable:
                pass
            result = await self.rotate()
            if result.kind not in ("retired", "not-needed", "cancelled"):
                raise RotationBlocked(f"Workspace slots A-Z are unavailable; rotation blocked ({result.reason}).")
            return await operation()

    async def _unfinished(self) -> bool:
        intents, fence = await asyncio.gather(self._intents.all(), self._admission.fence())
        return bool(intents) or fence is not None

    # --- one rotation -------------------------------------------------------------------------------
    async def rotate(self, *, recovery: bool = False) -> RotationResult:
        """Retire one eligible binding; with ``recovery`` only finish an interrupted retirement."""
        async with self._gate:
            authority = self._term.current()
            if authority is None:
                return RotationResult("retained", "authority-changed")
            result = await self._run(authority, prepare=not recovery)
            if result.kind == "cancelled" and result.reason == "probe-present" and not recovery:
                # The earlier deletion never happened: start a fresh retirement in the same call.
                result = await self._run(authority, prepare=True)
            self._events.record("Slot rotation", phase="workspace-rotation", result=result.kind,
                                reason=result.reason, slot=result.slot)
            if result.kind == "retired":
                self.retired += 1
            return result

    async def _run(self, authority: Authority, *, prepare: bool) -> RotationResult:
        """The executor: observe, decide (pure), act — until the step function finishes."""
        issued = False
        outcome: DeletionAnswer | None = None
        for _ in range(MAX_STEPS):
            intents, fence = await asyncio.gather(self._intents.all(), self._admission.fence())
            state = await self._observe(authority, prepare, intents, fence, issued, outcome)
            action = next_step(state)
            intent = intents[0] if intents else None
            if isinstance(action, Finish):
                return action.result
            if isinstance(action, AdoptFence):
                assert fence is not None
                if await self._admission.adopt(authority, fence) is None:
                    return RotationResult("retained", "fence-conflict")
            elif isinstance(action, Cancel):
                assert fence is not None
                return await self._cancel(fence, authority, action.cancelled)
            elif isinstance(action, RemoveFence):
                assert fence is not None
                await self._admission.remove_fence(authority, fence, phases=(action.phase,))
                return _about(action.then, fence.slot, fence.binding_key) if action.then.kind == "retired" \
                    else action.then
            elif isinstance(action, PrepareIntent):
                if not await self._prepare(authority, action.victim_key):
                    return RotationResult("blocked", "state-changed")
                await self._checkpoint("intent-written")
            elif isinstance(action, RestampIntent):
                assert intent is not None
                async with self._store.unit_of_work(authority) as uow:
                    await uow.retirements.set_epoch(intent.id, authority.epoch)
            elif isinstance(action, Commit):
                assert intent is not None
                await self._commit(intent, fence, authority)
                return RotationResult("retired", slot=intent.slot, binding_key=intent.binding_key)
            elif isinstance(action, DropIntent):
                assert intent is not None
                if action.remove_fence and fence is not None:
                    await self._admission.remove_fence(authority, fence, phases=("fenced",))
                async with self._store.unit_of_work(authority) as uow:
                    await uow.retirements.remove(intent.id)
                return RotationResult("retained", "protection-changed")
            elif isinstance(action, AcquireFence):
                assert intent is not None
                acquired = await self._admission.acquire_fence(
                    authority, operation_id=self._new_id(), intent_id=intent.id, binding_key=intent.binding_key,
                    slot=intent.slot, chat_id=intent.chat_id, thread_id=intent.thread_id or 0,
                    leader_epoch=authority.epoch)
                if isinstance(acquired, str):
                    return RotationResult("retained", acquired)
                await self._checkpoint("fenced")
            elif isinstance(action, IssueDeletion):
                assert fence is not None
                if await self._admission.set_phase(authority, fence, "deletion-issued", from_phases=("fenced",)) is None:
                    return RotationResult("retained", "fence-conflict")
                issued = True
                await self._checkpoint("permit-issued")
            elif isinstance(action, DeleteTopic):
                assert intent is not None
                outcome = await self._delete_once(intent)
                await self._checkpoint("delete-answered")
            elif isinstance(action, ProbeTopic):
                assert intent is not None
                outcome = await self._probe(intent)
            elif isinstance(action, MarkRejected):
                assert fence is not None
                if await self._admission.set_phase(authority, fence, "deletion-rejected",
                                                   from_phases=("deletion-issued",)) is None:
                    return RotationResult("retained", "fence-conflict")
                if action.checkpoint:
                    await self._checkpoint("deletion-rejected")
            elif isinstance(action, MarkCommitReady):
                assert fence is not None and intent is not None
                if await self._admission.set_phase(authority, fence, "commit-ready",
                                                   from_phases=("deletion-issued",)) is None:
                    return RotationResult("retained", "fence-conflict")
                await self._checkpoint("commit-ready")
                self._events.record("Workspace slot rotated", phase="workspace-rotation", slot=intent.slot,
                                    threadId=intent.thread_id)
        return RotationResult("retained", "no-progress")

    async def _observe(self, authority: Authority, prepare: bool, intents: list[RetirementIntent],
                       fence: Fence | None, issued: bool, outcome: DeletionAnswer | None) -> RetirementState:
        read: dict[str, Binding | None] = {}  # each binding read once per observation (fence and intent share it)

        async def binding(key: str) -> Binding | None:
            if key not in read:
                read[key] = await self._bindings.get(key)
            return read[key]

        fence_view = None
        if fence is not None:
            fence_view = FenceView(intent_id=fence.retirement_intent_id, owner=fence.owner, phase=fence.phase,
                                   binding_exists=await binding(fence.binding_key) is not None)
        views = []
        for intent in intents:
            current = await binding(intent.binding_key)
            unchanged = current == intent.binding
            needs_eligibility = len(intents) == 1 and unchanged and (fence is None or fence.phase == "fenced")
            views.append(IntentView(id=intent.id, epoch=intent.leader_epoch, binding_exists=current is not None,
                                    binding_unchanged=unchanged,
                                    eligible=needs_eligibility and await self._occupancy.eligible(intent, intents, fence)))
        plan = None
        if not intents and prepare:
            snapshot, _ = await self._occupancy.snapshot(None, intents, fence)
            plan = snapshot.plan(self._clock.now_ms())
        return RetirementState(owner=self._admission.owner, epoch=authority.epoch, prepare=prepare,
                               term_current=self._term.is_current(authority), intents=tuple(views), fence=fence_view,
                               plan=plan, issued=issued, outcome=outcome)

    async def _prepare(self, authority: Authority, victim_key: str) -> bool:
        victim = await self._bindings.get(victim_key)
        if victim is None:
            return False
        intent = RetirementIntent(id=RetirementIntent.make_id(victim), binding_key=victim.binding_key,
                                  binding=victim, slot=victim.slot or "", chat_id=victim.chat_id,
                                  thread_id=victim.thread_id if victim.has_live_topic else None,
                                  leader_epoch=authority.epoch, requested_at_ms=self._clock.now_ms())
        async with self._store.unit_of_work(authority) as uow:
            if await uow.bindings.get(victim.binding_key) != victim:
                return False
            await uow.retirements.insert(intent)
        return True

    async def _delete_once(self, intent: RetirementIntent) -> DeletionAnswer:
        if intent.thread_id is None:
            return "absent"  # the topic was already deleted (cleanup); nothing to ask Telegram
        result = await self._gateway.delete_topic(intent.target)
        if result.outcome in (CallOutcome.OK, CallOutcome.GONE):
            return "absent"
        if result.outcome in (CallOutcome.REJECTED, CallOutcome.RETRY_AFTER, CallOutcome.NOT_MODIFIED):
            return "rejected"
        return "unknown"

    async def _probe(self, intent: RetirementIntent) -> DeletionAnswer:
        """Non-destructive visibility probe of the exact thread whose deletion outcome is unknown."""
        if intent.thread_id is None:
            return "absent"
        result = await self._gateway.send_chat_action(intent.target, "typing")
        answer: DeletionAnswer = "absent" if result.outcome is CallOutcome.GONE else (
            "present" if result.outcome is CallOutcome.OK else "unknown")
        self._events.record("Probed a topic whose deletion outcome was unknown", phase="workspace-rotation-probe",
                            threadId=intent.thread_id, answer=answer)
        return answer

    async def _commit(self, intent: RetirementIntent, fence: Fence | None, authority: Authority) -> None:
        async with self._store.unit_of_work(authority) as uow:
            await uow.bindings.delete(intent.binding_key)
            await uow.retirements.remove(intent.id)
            if fence is not None:
                await uow.admission.remove_fence(fence, phases=("commit-ready", "deletion-issued"))

    async def _cancel(self, fence: Fence, authority: Authority, cancelled: RotationResult) -> RotationResult:
        """A proven rejection: withdraw the intent and release the fence; the binding is kept."""
        async with self._store.unit_of_work(authority) as uow:
            await uow.retirements.remove(fence.retirement_intent_id)
            removed = await uow.admission.remove_fence(fence, phases=("deletion-rejected",))
        if not removed:
            return RotationResult("retained", "fence-release-unconfirmed")
        self._events.record("Slot retirement cancelled after Telegram refused the deletion",
                            phase="workspace-rotation", slot=fence.slot, threadId=fence.thread_id)
        return _about(cancelled, fence.slot, fence.binding_key) if cancelled.kind == "cancelled" else cancelled

    async def occupancy(self) -> RotationStatus:
        """For status: slots in use, inactive bindings in rotation order, and the fence."""
        intents, fence = await asyncio.gather(self._intents.all(), self._admission.fence())
        snapshot, bindings = await self._occupancy.snapshot(None, intents, fence)
        order = sorted((c for c in snapshot.candidates if c.inactive_since_ms is not None),
                       key=lambda c: (c.inactive_since_ms, c.slot))
        used = sum(1 for b in bindings.values() if b.slot)
        return RotationStatus(
            slots_used=used, slots_free=26 - used,
            rotation_order=tuple(RotationCandidate(c.slot.upper(), int(c.inactive_since_ms or 0), str(c.protection))
                                 for c in order),
            fence=None if fence is None else FenceStatus(fence.slot, fence.phase, fence.thread_id),
            intents=tuple(IntentStatus(i.slot, i.binding_key) for i in intents),
            retired=self.retired)


def _about(result: RotationResult, slot: str, binding_key: str) -> RotationResult:
    return RotationResult(result.kind, result.reason, slot=slot, binding_key=binding_key)
