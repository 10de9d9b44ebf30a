"""Which slots are taken and which binding may be retired: the occupancy snapshot a rotation decides on.

One snapshot reads the store (bindings, owners, pending cleanups, queued messages, queued output)
and the roster (who is live, whose delivery route is open) and hands them to the pure
:func:`topicbus.core.slots.capture_occupancy`: every slot in use, and each binding's protection (a
live owner, accepted work, a delivery route, a durable inactivity proof). :class:`SlotRotation`
(``leader/rotation``) asks it for the plan and for whether its victim is still eligible; status
shows it.
"""

from __future__ import annotations

import asyncio

from topicbus.core.slots import (Evidence, ExternalEvidence, LocalOccupancy, OccupancyBinding, OccupancySnapshot,
                                 Protection, capture_occupancy)
from topicbus.core.target import Target
from topicbus.leader.roster import Roster
from topicbus.core.admission import Fence
from topicbus.core.bindings import Binding
from topicbus.core.clock import Clock
from topicbus.core.retirement import RetirementIntent
from topicbus.ports.store import Store


class SlotOccupancy:
    def __init__(self, roster: Roster, *, store: Store, clock: Clock):
        self._roster = roster
        self._clock = clock
        self._bindings = store.bindings
        self._journal = store.journal
        self._cleanups = store.cleanups
        self._outbox = store.outbox

    async def eligible(self, intent: RetirementIntent, intents: list[RetirementIntent], fence: Fence | None) -> bool:
        """Whether the intent's binding may still be retired (no protection came up since it was chosen)."""
        snapshot, _ = await self.snapshot(intent.id, intents, fence)
        candidate = next((c for c in snapshot.candidates if c.binding_key == intent.binding_key), None)
        return candidate is not None and candidate.protection is Protection.ELIGIBLE

    async def snapshot(self, exclude_intent: str | None, intents: list[RetirementIntent],
                       fence: Fence | None) -> tuple[OccupancySnapshot, dict[str, Binding]]:
        """Occupancy now; ``intents`` and ``fence`` as the caller has just read them (not read twice)."""
        # Five independent reads, queued on the connection's thread together: it runs them back to
        # back instead of waiting for the loop to hand it each next one (three snapshots a rotation).
        all_bindings, owner_rows, cleanups, queued, outbox_keys = await asyncio.gather(
            self._bindings.all(), self._bindings.owners(), self._cleanups.all(), self._journal.count_pending(),
            self._outbox.pending_binding_keys())
        bindings = {b.binding_key: b for b in all_bindings}
        owners = {o.binding_key for o in owner_rows}
        live_keys = {f.binding_key for f in self._roster.followers() if f.binding_key}
        current = [b for b in bindings.values() if b.binding_key in owners or b.binding_key in live_keys
                   or b.kind == "leader"]
        cleanup_keys = {c.binding_key for c in cleanups}
        others = [i for i in intents if i.id != exclude_intent]
        local = LocalOccupancy(
            current_targets=frozenset(_target(b) for b in current),
            current_slots=frozenset(b.slot for b in current if b.slot),
            pending_cleanup_targets=frozenset(Target(c.chat_id, c.thread_id) for c in cleanups),
            pending_cleanup_slots=frozenset(b.slot for b in bindings.values() if b.binding_key in cleanup_keys and b.slot),
            retirement_binding_keys=frozenset(i.binding_key for i in others),
            retirement_slots=frozenset(i.slot for i in others),
        )

        def external(ob: OccupancyBinding) -> ExternalEvidence:
            key = ob.binding_key
            owner = Evidence.PROTECTED if key in owners or key in live_keys else Evidence.CLEAR
            work = Evidence.PROTECTED if queued.get(key) or key in outbox_keys else Evidence.CLEAR
            route = Evidence.PROTECTED if self._roster.is_online(key) else Evidence.CLEAR
            return ExternalEvidence(live_owner=owner, accepted_work=work, delivery_authority=route)

        snapshot = capture_occupancy(
            [OccupancyBinding(b.binding_key, b.slot, _target(b), b.inactive_since_ms) for b in bindings.values()],
            local, external, self._clock.now_ms(), [fence.slot] if fence else [])
        return snapshot, bindings


def _target(b: Binding) -> Target:
    return Target(b.chat_id, b.thread_id or 0)
