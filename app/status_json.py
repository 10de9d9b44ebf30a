"""The public status JSON (``GET /v1/status``, ``topicbus status --json``): the one serializer of
:class:`~topicbus.core.status.StatusReport`, each way.

The document's field names are public (scripts read them) and stay as they are: camelCase, in this
order. :func:`status_document` writes it (the bus server); :func:`status_report` reads it back
(``topicbus status`` renders the text board from it), leniently: a field a leader of another release
does not send reads as absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from topicbus.core.status import (BindingStatus, BudgetStatus, CleanupStatus, Counters, FenceStatus, FollowerStatus,
                                  IntentStatus, ObservationStatus, RotationCandidate, RotationStatus, StatusReport,
                                  TermStatus)


def status_document(report: StatusReport) -> dict[str, Any]:
    """The JSON document of a report (a process that is not leading has role, epoch and two empty lists)."""
    document: dict[str, Any] = {"role": report.role, "epoch": report.epoch}
    term = report.term
    if term is not None:
        document.update({"chatId": term.chat_id, "cleanupPolicy": term.cleanup_policy,
                         "displayMode": term.display_mode, "controlThreadId": term.control_thread_id})
    document["followers"] = [{
        "instanceId": f.instance_id, "slot": f.slot, "threadId": f.thread_id, "pid": f.pid,
        "heartbeatAgeMs": f.heartbeat_age_ms, "lastHeartbeatMs": f.last_heartbeat_ms, "workspace": f.workspace,
        "bindingKey": f.binding_key, "online": f.online} for f in report.followers]
    document["bindings"] = [{
        "bindingKey": b.binding_key, "slot": b.slot, "title": b.title, "threadId": b.thread_id, "kind": b.kind,
        "cwd": b.cwd, "session": b.session, "state": b.state, "topicState": b.topic_state,
        "inactiveSinceMs": b.inactive_since_ms, "queued": b.queued, "outboxItems": b.outbox_items,
        "outboxUnits": b.outbox_units, "heartbeatAgeMs": b.heartbeat_age_ms, "instanceId": b.instance_id,
        "deletesInMs": b.deletes_in_ms} for b in report.bindings]
    if term is None:
        return document
    budget, rotation, stats = term.budget, term.rotation, term.stats
    document.update({
        "pendingCleanups": [{"id": c.id, "threadId": c.thread_id, "reason": c.reason, "lastError": c.last_error}
                            for c in term.pending_cleanups],
        "pendingObservations": [{"instanceId": o.instance_id, "slot": o.slot, "operationId": o.operation_id}
                                for o in term.pending_observations],
        "outboxPending": term.outbox_pending,
        "budget": {"usedLastMinute": budget.used_last_minute, "perMinute": budget.per_minute,
                   "perSecond": budget.per_second, "reserve": budget.reserve, "pausedForS": budget.paused_for_s,
                   "retryAfterHits": budget.retry_after_hits},
        "rotation": {
            "slotsUsed": rotation.slots_used, "slotsFree": rotation.slots_free,
            "rotationOrder": [{"slot": r.slot, "inactiveSinceMs": r.inactive_since_ms, "protection": r.protection}
                              for r in rotation.rotation_order],
            "fence": None if rotation.fence is None else {"slot": rotation.fence.slot, "phase": rotation.fence.phase,
                                                          "threadId": rotation.fence.thread_id},
            "intents": [{"slot": i.slot, "bindingKey": i.binding_key} for i in rotation.intents],
            "retired": rotation.retired},
        "stats": {"routed": stats.routed, "duplicates": stats.duplicates, "ignored": stats.ignored,
                  "registrations": stats.registrations, "delivered": stats.delivered, "sent": stats.sent},
    })
    return document


def status_report(document: Mapping[str, Any]) -> StatusReport:
    """A report read back from its JSON document."""
    followers = tuple(FollowerStatus(
        instance_id=f.get("instanceId") or "", slot=f.get("slot"), thread_id=f.get("threadId"), pid=f.get("pid"),
        heartbeat_age_ms=f.get("heartbeatAgeMs") or 0, last_heartbeat_ms=f.get("lastHeartbeatMs") or 0,
        workspace=f.get("workspace") or "", binding_key=f.get("bindingKey"), online=bool(f.get("online")))
        for f in _rows(document, "followers"))
    bindings = tuple(BindingStatus(
        binding_key=b.get("bindingKey") or "", slot=b.get("slot"), title=b.get("title") or "",
        thread_id=b.get("threadId"), kind=b.get("kind") or "", cwd=b.get("cwd") or "", session=b.get("session") or "",
        state=b.get("state") or "", topic_state=b.get("topicState") or "", inactive_since_ms=b.get("inactiveSinceMs"),
        queued=b.get("queued") or 0, outbox_items=b.get("outboxItems") or 0, outbox_units=b.get("outboxUnits") or 0,
        heartbeat_age_ms=b.get("heartbeatAgeMs"), instance_id=b.get("instanceId"), deletes_in_ms=b.get("deletesInMs"))
        for b in _rows(document, "bindings"))
    term = _term(document) if "cleanupPolicy" in document else None
    return StatusReport(role=document.get("role") or "?", epoch=document.get("epoch"), followers=followers,
                        bindings=bindings, term=term)


def _rows(document: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
    return [row for row in document.get(name) or () if isinstance(row, Mapping)]


def _term(document: Mapping[str, Any]) -> TermStatus:
    budget = document.get("budget") or {}
    rotation = document.get("rotation") or {}
    stats = document.get("stats") or {}
    fence = rotation.get("fence")
    return TermStatus(
        chat_id=document.get("chatId") or 0, cleanup_policy=document.get("cleanupPolicy") or "?",
        display_mode=document.get("displayMode") or "?", control_thread_id=document.get("controlThreadId"),
        pending_cleanups=tuple(CleanupStatus(c.get("id") or "", c.get("threadId") or 0, c.get("reason") or "",
                                             c.get("lastError")) for c in _rows(document, "pendingCleanups")),
        pending_observations=tuple(ObservationStatus(o.get("instanceId") or "", o.get("slot"), o.get("operationId") or "")
                                   for o in _rows(document, "pendingObservations")),
        outbox_pending=document.get("outboxPending") or 0,
        budget=BudgetStatus(used_last_minute=budget.get("usedLastMinute") or 0, per_minute=budget.get("perMinute"),
                            per_second=budget.get("perSecond") or 0.0, reserve=budget.get("reserve") or 0,
                            paused_for_s=budget.get("pausedForS") or 0.0,
                            retry_after_hits=budget.get("retryAfterHits") or 0),
        rotation=RotationStatus(
            slots_used=rotation.get("slotsUsed") or 0, slots_free=rotation.get("slotsFree") or 0,
            rotation_order=tuple(RotationCandidate(r.get("slot") or "", r.get("inactiveSinceMs"),
                                                   r.get("protection") or "") for r in _rows(rotation, "rotationOrder")),
            fence=FenceStatus(fence.get("slot") or "", fence.get("phase") or "", fence.get("threadId") or 0)
            if isinstance(fence, Mapping) else None,
            intents=tuple(IntentStatus(i.get("slot") or "", i.get("bindingKey") or "") for i in _rows(rotation, "intents")),
            retired=rotation.get("retired") or 0),
        stats=Counters(**{name: stats.get(name) or 0 for name in ("routed", "duplicates", "ignored", "registrations",
                                                                  "delivered", "sent")}))
