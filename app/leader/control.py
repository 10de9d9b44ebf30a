"""What an owner can do from the control topic: the cleanup policy, the display mode, ``/forget``.

Each method answers with the text the control topic shows; the handlers only parse and reply.
"""

from __future__ import annotations

from topicbus.ports.store import Admission, Store
from topicbus.logsetup import EventJournal
from collections.abc import Callable
from topicbus.core.display import DisplayMode
from topicbus.core.registry import FollowerRecord
from topicbus.core.target import Target
from topicbus.leader.departure import CleanupUnconfirmed, Departures
from topicbus.leader.preferences import Preferences
from topicbus.leader.roster import Roster
from topicbus.leader.term import LeaderTerm, new_operation_id
from topicbus.leader.titles import DisplayReconciler
from topicbus.protocol import CAP_DISPLAY_TITLE
from topicbus.core.admission import PROFILE
from topicbus.leader.pruner import FollowerPruner


class DisplayModeRefused(Exception):
    """A connected follower cannot follow a display mode change."""


class ControlDesk:
    def __init__(self, *, term: LeaderTerm, roster: Roster, preferences: Preferences, admission: Admission,
                 display: DisplayReconciler, departures: Departures, pruner: FollowerPruner, store: Store,
                 events: EventJournal, new_id: Callable[[], str] = new_operation_id):
        self._term = term
        self._events = events
        self._new_id = new_id
        self._roster = roster
        self.preferences = preferences
        self._admission = admission
        self._display = display
        self._departures = departures
        self._pruner = pruner
        self._bindings = store.bindings

    @property
    def cleanup_grace_ms(self) -> int:
        """How long a finished agent's topic stays before cleanup deletes it (TOPICBUS_CLEANUP_GRACE_S)."""
        return self._departures.scheduled.grace_ms

    async def set_cleanup_policy(self, enabled: bool) -> None:
        await self.preferences.set_cleanup_policy(enabled)

    async def set_display_mode(self, mode: DisplayMode) -> int:
        """Persist the mode and apply it, in one admitted operation; returns titles changed."""
        authority = self._term.authority()
        lacking = [f.slot or f.instance_id for f in self._roster.followers() if CAP_DISPLAY_TITLE not in f.capabilities]
        if mode != self.preferences.display_mode and lacking:
            raise DisplayModeRefused(
                "Update or restart these followers before changing the display mode: " + ", ".join(lacking) + ".")

        async def op() -> int:
            await self.preferences.set_display_mode(mode, authority)
            return await self._display.reconcile()

        return await self._admission.run(self._new_id(), "workspace.set-display-mode", [PROFILE], op)

    async def forget_slot(self, slot: str) -> str:
        """Operator proof that the agent of ``slot`` is gone: the same departure as a proven death.

        The answers are for a phone: they name the slot and its title, never an internal id, and
        say what to do next."""
        slot = slot.strip().upper()
        binding = next((b for b in await self._bindings.all() if b.slot == slot), None)
        if binding is None:
            return f"No agent holds slot {slot}. /status lists the slots in use."
        if binding.kind == "leader":
            return f"Slot {slot} is this control topic; it cannot be forgotten."
        title = binding.display_title or binding.thread_name
        name = f"Slot {slot} ({title})" if title and title != slot else f"Slot {slot}"
        live = [f for f in self._roster.followers() if f.binding_key == binding.binding_key]
        if live:
            return (f"{name} still has a running agent, so it is not forgotten. End the agent instead: send /kill "
                    "in its topic, or stop it on its computer. Its topic is then deleted or kept as /cleanup says; "
                    "/forget is only for an agent that is gone but still counted.")
        owner = await self._bindings.owner(binding.binding_key)
        if owner is None:
            expedited = await self._departures.scheduled.expedite(binding.binding_key)
            if expedited:
                return f"{name} forgotten: its topic was deleted before the end of its grace time."
            if expedited is not None:
                return f"{name} forgotten: its topic is deleted as soon as its last output is posted."
            return f"{name} has no agent to forget: it was already released (its topic is kept, already detached)."
        record = FollowerRecord(instance_id=owner.instance_id, registration_generation=owner.registration_generation,
                                pid=owner.pid, process_birth_id=owner.process_birth_id, host_id=owner.host_id,
                                profile_key=binding.binding_key, target=Target(binding.chat_id, binding.thread_id),
                                slot=binding.slot, binding_key=binding.binding_key)
        self._pruner.forget_instance(owner.instance_id)
        try:
            deleted = await self._departures.forget(record)
        except CleanupUnconfirmed as exc:
            if "not confirmed" not in str(exc):
                return f"{name} cannot be forgotten right now; try again in a moment."
            return (f"{name}: Telegram did not confirm that its topic was deleted. Nothing is lost: the leader "
                    "tries again at its next start, or send /forget again in a moment.")
        self._events.record("Operator forgot a slot", phase="operator-forget", slot=slot, cleanup=deleted)
        if deleted:
            return (f"{name} forgotten: its topic was deleted. If that agent comes back, it gets a new topic "
                    "under the same letter.")
        return (f"{name} forgotten: its topic is kept (cleanup is off) and is reused if that agent comes back; "
                "otherwise the slot can go to a new agent when all 26 are taken.")
