"""The public status JSON (``/v1/status``, ``topicbus status --json``): its field names are public and
stay as they were, and the one serializer reads back what it writes."""

from __future__ import annotations

import json

from topicbus.core.status import (BindingStatus, BudgetStatus, CleanupStatus, Counters, FenceStatus, FollowerStatus,
                                  IntentStatus, ObservationStatus, RotationCandidate, RotationStatus, StatusReport,
                                  TermStatus)
from topicbus.status_json import status_document, status_report

FOLLOWER = FollowerStatus(instance_id="i-1", slot="B", thread_id=8, pid=42, heartbeat_age_ms=1200,
                          last_heartbeat_ms=99_000, workspace="/repo#s", binding_key="k-b", online=True)
BINDING = BindingStatus(binding_key="k-b", slot="B", title="Shop", thread_id=8, kind="follower", cwd="/repo",
                        session="s", state="live", topic_state="open", inactive_since_ms=None, queued=2,
                        outbox_items=3, outbox_units=40, heartbeat_age_ms=1200, instance_id="i-1", deletes_in_ms=None)
LEADING = StatusReport(
    role="leader", epoch=4, followers=(FOLLOWER,), bindings=(BINDING,),
    term=TermStatus(
        chat_id=-100, cleanup_policy="on", display_mode="letters", control_thread_id=2,
        pending_cleanups=(CleanupStatus("c-1", 18, "forget", "timeout"),),
        pending_observations=(ObservationStatus("i-2", "C", "op-1"),), outbox_pending=3,
        budget=BudgetStatus(used_last_minute=7, per_minute=20.0, per_second=1.0, reserve=4, paused_for_s=1.5,
                            retry_after_hits=1),
        rotation=RotationStatus(slots_used=3, slots_free=23,
                                rotation_order=(RotationCandidate("C", 5_000, "eligible"),),
                                fence=FenceStatus("D", "deletion-issued", 23), intents=(IntentStatus("D", "k-d"),),
                                retired=1),
        stats=Counters(routed=10, duplicates=1, ignored=2, registrations=3, delivered=9, sent=12)))


def test_the_document_keeps_its_public_field_names_in_their_order():
    document = status_document(LEADING)
    assert list(document) == ["role", "epoch", "chatId", "cleanupPolicy", "displayMode", "controlThreadId",
                              "followers", "bindings", "pendingCleanups", "pendingObservations", "outboxPending",
                              "budget", "rotation", "stats"]
    assert list(document["followers"][0]) == ["instanceId", "slot", "threadId", "pid", "heartbeatAgeMs",
                                              "lastHeartbeatMs", "workspace", "bindingKey", "online"]
    assert list(document["bindings"][0]) == ["bindingKey", "slot", "title", "threadId", "kind", "cwd", "session",
                                             "state", "topicState", "inactiveSinceMs", "queued", "outboxItems",
                                             "outboxUnits", "heartbeatAgeMs", "instanceId", "deletesInMs"]
    assert document["pendingCleanups"] == [{"id": "c-1", "threadId": 18, "reason": "forget", "lastError": "timeout"}]
    assert document["pendingObservations"] == [{"instanceId": "i-2", "slot": "C", "operationId": "op-1"}]
    assert document["budget"] == {"usedLastMinute": 7, "perMinute": 20.0, "perSecond": 1.0, "reserve": 4,
                                  "pausedForS": 1.5, "retryAfterHits": 1}
    assert document["rotation"] == {
        "slotsUsed": 3, "slotsFree": 23, "rotationOrder": [{"slot": "C", "inactiveSinceMs": 5_000,
                                                            "protection": "eligible"}],
        "fence": {"slot": "D", "phase": "deletion-issued", "threadId": 23},
        "intents": [{"slot": "D", "bindingKey": "k-d"}], "retired": 1}
    assert document["stats"] == {"routed": 10, "duplicates": 1, "ignored": 2, "registrations": 3, "delivered": 9,
                                 "sent": 12}


def test_a_process_that_is_not_leading_says_its_role_and_epoch_only():
    assert status_document(StatusReport(role="standby", epoch=None)) == {
        "role": "standby", "epoch": None, "followers": [], "bindings": []}


def test_what_the_serializer_writes_it_reads_back():
    for report in (LEADING, StatusReport(role="standby", epoch=3)):
        assert status_report(json.loads(json.dumps(status_document(report)))) == report
