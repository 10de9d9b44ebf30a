"""The leader's view for operators: the report behind ``/v1/status``, ``topicbus status`` and /status
(``core/status``; ``status_json.py`` writes it as the public JSON)."""

from __future__ import annotations

from topicbus.core.status import (BindingStatus, CleanupStatus, Counters, FollowerStatus, ObservationStatus,
                                  StatusReport, TermStatus)
from topicbus.ports.store import Store
from topicbus.core.clock import Clock
from topicbus.core.target import Target
from topicbus.leader.delivery import DeliveryHub
from topicbus.leader.pruner import FollowerPruner
from topicbus.leader.outbound import OutboundScheduler
from topicbus.leader.preferences import Preferences
from topicbus.leader.registration import Registrations
from topicbus.leader.roster import Roster
from topicbus.leader.rotation import SlotRotation
from topicbus.leader.routing import Router
from topicbus.leader.term import LeaderTerm
from topicbus.leader.topics import ControlTopic


class StatusView:
    def __init__(self, *, term: LeaderTerm, roster: Roster, delivery: DeliveryHub, preferences: Preferences,
                 control: ControlTopic, router: Router, registrations: Registrations, outbound: OutboundScheduler,
                 rotation: SlotRotation, pruner: FollowerPruner, store: Store, clock: Clock, chat_id: int):
        self._term = term
        self._clock = clock
        self._chat_id = chat_id
        self._roster = roster
        self._delivery = delivery
        self._preferences = preferences
        self._control = control
        self._router = router
        self._registrations = registrations
        self._outbound = outbound
        self._rotation = rotation
        self._pruner = pruner
        self._bindings = store.bindings
        self._cleanups = store.cleanups
        self._scheduled = store.scheduled_cleanups

    async def snapshot(self, role: str = "leader") -> StatusReport:
        now = self._clock.now_ms()
        followers = self._roster.followers()
        by_binding = {f.binding_key: f for f in followers}
        queued = await self._router.journal.count_pending()
        owners = {o.binding_key for o in await self._bindings.owners()}
        policy = await self._preferences.cleanup_policy()
        backlog = self._outbound.backlog()
        ending = {s.binding_key: s for s in await self._scheduled.all()}
        bindings = []
        for b in await self._bindings.all():
            live = by_binding.get(b.binding_key)
            if b.kind == "leader":
                state = "control"
            elif live is not None:
                state = "live"
            elif b.topic_state == "deleted":
                state = "deleted"
            elif b.binding_key in ending:
                state = "ending"  # its agent ended; the topic is deleted when its grace period is over
            elif b.binding_key in owners:
                state = "offline"
            else:
                state = "preserved" if b.inactive_since_ms is not None else "detached"
            outbox_items, outbox_units = backlog.get(Target(b.chat_id, b.thread_id), (0, 0))
            bindings.append(BindingStatus(
                binding_key=b.binding_key, slot=b.slot, title=b.title, thread_id=b.thread_id, kind=b.kind,
                cwd=b.cwd, session=b.session, state=state, topic_state=b.topic_state,
                inactive_since_ms=b.inactive_since_ms, queued=queued.get(b.binding_key, 0),
                outbox_items=outbox_items, outbox_units=outbox_units,
                heartbeat_age_ms=(now - live.last_heartbeat_ms) if live else None,
                instance_id=live.instance_id if live else None,
                deletes_in_ms=max(0, ending[b.binding_key].due_at_ms - now) if state == "ending" else None))
        term = TermStatus(
            chat_id=self._chat_id,
            cleanup_policy={True: "on", False: "off", None: "unknown"}[policy],
            display_mode=str(self._preferences.display_mode),
            control_thread_id=self._control.thread_id,
            pending_cleanups=tuple(CleanupStatus(c.id, c.thread_id, c.reason, c.last_error)
                                   for c in await self._cleanups.all()),
            pending_observations=tuple(ObservationStatus(o.follower.instance_id, o.follower.slot, o.operation_id)
                                       for o in self._pruner.pending_observations()),
            outbox_pending=await self._router.outbox.count_pending(),
            budget=self._outbound.budget_view(),
            rotation=await self._rotation.occupancy(),
            stats=Counters(routed=self._router.stats["routed"], duplicates=self._router.stats["duplicates"],
                           ignored=self._router.stats["ignored"], registrations=self._registrations.count,
                           delivered=self._delivery.delivered, sent=self._outbound.sent))
        return StatusReport(
            role=role, epoch=self._term.epoch,
            followers=tuple(FollowerStatus(
                instance_id=f.instance_id, slot=f.slot, thread_id=f.target.thread_id if f.target else None,
                pid=f.pid, heartbeat_age_ms=now - f.last_heartbeat_ms, last_heartbeat_ms=f.last_heartbeat_ms,
                workspace=(f.cwd or "") + (f"#{f.session}" if f.session else ""), binding_key=f.binding_key,
                online=self._roster.is_online(f.binding_key or "")) for f in followers),
            bindings=tuple(bindings), term=term)
