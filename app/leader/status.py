"""The leader's view for operators: the document behind ``/v1/status``, ``topicbus status`` and /status."""

from __future__ import annotations

from typing import Any

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
from topicbus.storage.bindings import BindingRepository
from topicbus.storage.cleanups import CleanupRepository, ScheduledCleanupRepository


class StatusView:
    def __init__(self, *, term: LeaderTerm, roster: Roster, delivery: DeliveryHub, preferences: Preferences,
                 control: ControlTopic, router: Router, registrations: Registrations, outbound: OutboundScheduler,
                 rotation: SlotRotation, pruner: FollowerPruner):
        self._term = term
        self._roster = roster
        self._delivery = delivery
        self._preferences = preferences
        self._control = control
        self._router = router
        self._registrations = registrations
        self._outbound = outbound
        self._rotation = rotation
        self._pruner = pruner
        self._bindings = BindingRepository(term.db)
        self._cleanups = CleanupRepository(term.db)
        self._scheduled = ScheduledCleanupRepository(term.db)

    async def snapshot(self, role: str = "leader") -> dict[str, Any]:
        now = self._term.now_ms()
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
            bindings.append({
                "bindingKey": b.binding_key, "slot": b.slot, "title": b.title, "threadId": b.thread_id,
                "kind": b.kind, "cwd": b.cwd, "session": b.session, "state": state, "topicState": b.topic_state,
                "inactiveSinceMs": b.inactive_since_ms, "queued": queued.get(b.binding_key, 0),
                "outboxItems": backlog.get((b.chat_id, b.thread_id), (0, 0))[0],
                "outboxUnits": backlog.get((b.chat_id, b.thread_id), (0, 0))[1],
                "heartbeatAgeMs": (now - live.last_heartbeat_ms) if live else None,
                "instanceId": live.instance_id if live else None,
                "deletesInMs": max(0, ending[b.binding_key].due_at_ms - now) if state == "ending" else None,
            })
        return {
            "role": role, "epoch": self._term.epoch, "chatId": self._term.chat_id,
            "cleanupPolicy": {True: "on", False: "off", None: "unknown"}[policy],
            "displayMode": str(self._preferences.display_mode),
            "controlThreadId": self._control.thread_id,
            "followers": [{
                "instanceId": f.instance_id, "slot": f.slot, "threadId": f.target.thread_id if f.target else None,
                "pid": f.pid, "heartbeatAgeMs": now - f.last_heartbeat_ms, "lastHeartbeatMs": f.last_heartbeat_ms,
                "workspace": (f.cwd or "") + (f"#{f.session}" if f.session else ""), "bindingKey": f.binding_key,
                "online": self._roster.is_online(f.binding_key or ""),
            } for f in followers],
            "bindings": bindings,
            "pendingCleanups": [{"id": c.id, "threadId": c.thread_id, "reason": c.reason, "lastError": c.last_error}
                                for c in await self._cleanups.all()],
            "pendingObservations": [{"instanceId": o.follower.instance_id, "slot": o.follower.slot,
                                     "operationId": o.operation_id} for o in self._pruner.pending_observations()],
            "outboxPending": await self._router.outbox.count_pending(),
            "budget": self._outbound.budget_view(),
            "rotation": await self._rotation.occupancy(),
            "stats": dict(self._router.stats, registrations=self._registrations.count,
                          delivered=self._delivery.delivered, sent=self._outbound.sent),
        }
