"""Topic provisioning: give a workspace identity its binding and a live topic.

Same identity → same binding → same topic: an existing binding with a live topic is reused with
zero Telegram calls (a closed one is reopened first, or replaced when it cannot be); a binding whose
topic was deleted gets a new topic under its old slot and name;
a new identity gets the first free slot letter (from the slot planner) and a new topic. A new topic
and the binding's undelivered output moving to it commit together. Provisioning is serialised by one
gate so two registrations can never take the same letter or create two topics for one binding.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from topicbus.ports.store import Store
from topicbus.core.clock import Clock
from topicbus.logsetup import EventJournal
from topicbus.core.telegram import CallOutcome
from topicbus.leader.outbound import ScheduledGateway
from topicbus.core.display import DisplayBinding, initial_display_title
from topicbus.core.slots import FreeSlot, Protection, SlotCandidate, plan_slot_allocation, to_durable_slot
from topicbus.core.workspace import WorkspaceIdentity
from topicbus.leader.preferences import Preferences
from topicbus.core.bindings import Binding, OwnerRecord
from topicbus.core.authority import Authority


class SlotUnavailable(Exception):
    """Every workspace slot A–Z is taken."""

    def __init__(self) -> None:
        super().__init__("Workspace slot reservation is unavailable: all 26 slots A-Z are taken.")


class TopicCreationFailed(Exception):
    """Telegram did not create the topic; the message says why."""


@dataclass(frozen=True)
class ProvisionRequest:
    identity: WorkspaceIdentity
    kind: str  # 'leader' | 'follower'
    thread_name: str  # a new binding's name (an existing binding keeps its own)
    owner: OwnerRecord | None  # the routeable owner to record (None for the leader's own binding)
    manual_name: str | None = None  # a fixed title that every display mode keeps


class TopicProvisioner:
    def __init__(self, gateway: ScheduledGateway, preferences: Preferences, *,
                 output_moved: Callable[[], None], store: Store, clock: Clock, events: EventJournal, chat_id: int):
        self._store = store
        self._clock = clock
        self._events = events
        self._chat_id = chat_id
        self._output_moved = output_moved  # the outbound scheduler reads the outbox's topics again
        self._bindings = store.bindings
        self._gateway = gateway
        self._preferences = preferences
        self.gate = asyncio.Lock()

    async def provision(self, request: ProvisionRequest, authority: Authority) -> tuple[Binding, bool]:
        """Return the binding (with a live topic) and whether a topic was created."""
        async with self.gate:
            key = request.identity.binding_key
            binding = await self._bindings.get(key)
            if binding is not None and binding.topic_state == "closed" and binding.has_live_topic:
                binding = await self._reopen(binding, authority)
            if binding is not None and binding.has_live_topic:
                await self._commit_owner(binding, request, authority)
                return (await self._bindings.get(key)) or binding, False
            if binding is None:
                binding = await self._reserve(request, authority)
            title = await self._initial_title(binding)
            result = await self._gateway.create_topic(binding.chat_id, title)
            if result.outcome is not CallOutcome.OK:
                raise TopicCreationFailed(f"Telegram did not create the topic ({result.outcome}): {result.message}")
            thread_id = int(result.value)
            async with self._store.unit_of_work(authority) as uow:
                await uow.bindings.set_topic(key, thread_id=thread_id, display_title=title,
                                                     now_ms=self._clock.now_ms())
                if request.owner is not None:
                    await uow.bindings.set_owner(request.owner)
                await uow.bindings.mark_active(key)
                # Its undelivered output follows it to the new topic, in the same commit.
                moved = await uow.outbox.retarget(key, thread_id)
            if moved:
                self._output_moved()
            fresh = await self._bindings.get(key)
            assert fresh is not None
            return fresh, True

    async def _reopen(self, binding: Binding, authority: Authority) -> Binding:
        """A closed topic (closed by a cleanup whose delete failed, or by someone in Telegram) is
        reopened before a follower is bound to it again; a topic that turns out to be gone, or that
        Telegram will not reopen, is replaced by a new one (the caller creates it). Raises
        :class:`TopicCreationFailed` when Telegram's answer is unknown (the registration is retried)."""
        assert binding.thread_id is not None
        result = await self._gateway.reopen_topic(binding.target)
        self._events.record("Reopening a closed topic before binding it again", phase="topic-reopen",
                                 threadId=binding.thread_id, outcome=str(result.outcome))
        if result.outcome in (CallOutcome.AMBIGUOUS, CallOutcome.RETRY_AFTER):
            raise TopicCreationFailed(f"Telegram did not reopen the closed topic ({result.outcome}): {result.message}")
        async with self._store.unit_of_work(authority) as uow:
            if result.ok:
                await uow.bindings.set_topic_state(binding.binding_key, "open")
            else:  # gone, or refused: the binding keeps its slot and name and gets a new topic
                await uow.bindings.set_topic_state(binding.binding_key, "deleted")
        fresh = await self._bindings.get(binding.binding_key)
        assert fresh is not None
        return fresh

    async def _commit_owner(self, binding: Binding, request: ProvisionRequest, authority: Authority) -> None:
        async with self._store.unit_of_work(authority) as uow:
            if request.owner is not None:
                await uow.bindings.set_owner(request.owner)
            await uow.bindings.mark_active(binding.binding_key)

    async def _reserve(self, request: ProvisionRequest, authority: Authority) -> Binding:
        """Durably reserve a slot for a new binding before any Telegram call (no topic yet)."""
        now = self._clock.now_ms()
        async with self._store.unit_of_work(authority) as uow:
            # The planner is the one allocator: a free letter is taken here; when every letter is
            # held, the capacity runner (rotation) decides what may be retired, with full evidence.
            # A letter under a retirement fence still belongs to the victim's binding row until the
            # commit that removes binding, intent and fence together, so it is never taken here.
            held = [SlotCandidate(key, slot.lower(), None, Protection.PROTECTED)
                    for key, slot in (await uow.bindings.slots()).items()]
            plan = plan_slot_allocation(held, (), now)
            if not isinstance(plan, FreeSlot):
                raise SlotUnavailable()
            slot = to_durable_slot(plan.slot)
            identity = request.identity
            binding = Binding(
                binding_key=identity.binding_key, kind=request.kind, host_id=identity.host_id, cwd=identity.cwd,
                session=identity.session, slot=slot, chat_id=self._chat_id, thread_id=None, topic_state="deleted",
                thread_name=request.thread_name, manual_name=request.manual_name, display_title=None, inactive_since_ms=None,
                offline_notified=False, created_at_ms=now, updated_at_ms=now,
            )
            await uow.bindings.insert(binding)
            return binding

    async def _initial_title(self, binding: Binding) -> str:
        others = [b for b in await self._bindings.all() if b.binding_key != binding.binding_key]
        mode = self._preferences.display_mode
        title = initial_display_title([_display(b, live=b.has_live_topic) for b in others],
                                      _display(binding, live=True), mode)
        return title or binding.manual_name or binding.thread_name or binding.slot or "topicbus"


def _display(binding: Binding, *, live: bool) -> DisplayBinding:
    return DisplayBinding(binding_key=binding.binding_key, cwd=binding.cwd or None, slot=binding.slot,
                          thread_name=binding.thread_name, manual_name=binding.manual_name, live=live)
