"""LeaderHealth: the reasons behind a 503 from /healthz, with a manual clock."""

from __future__ import annotations

from dataclasses import dataclass

from topicbus.leader.health import LeaderHealth


@dataclass
class Poller:
    last_cycle_at: float = 0.0
    done: bool = False


@dataclass
class Receipts:
    journal_error: str | None = None


def _health(now: list[float]) -> tuple[LeaderHealth, Poller, Receipts]:
    health = LeaderHealth(poll_deadline_s=60, lease_stale_after_ms=8_000, poll_timeout_s=10, clock=lambda: now[0])
    poller, receipts = Poller(), Receipts()
    health.begin_term(poller, receipts)
    return health, poller, receipts


def test_a_fresh_term_is_healthy_and_the_deadline_is_never_shorter_than_a_long_poll():
    now = [0.0]
    health, _, _ = _health(now)
    assert health.reasons() == []
    assert LeaderHealth(poll_deadline_s=1, lease_stale_after_ms=8_000, poll_timeout_s=10).poll_deadline_s == 17


def test_polling_reason_until_a_batch_completes():
    now = [0.0]
    health, poller, _ = _health(now)
    now[0] = 59.0
    health.lease_refreshed()
    assert health.reasons() == []
    now[0] = 61.0
    health.lease_refreshed()
    assert health.reasons() == ["polling: no getUpdates batch completed for 61s (deadline 60s)"]
    poller.last_cycle_at = 61.0
    assert health.reasons() == []
    poller.done = True
    assert health.reasons() == ["polling: the poll loop stopped"]


def test_lease_reason_on_a_failed_refresh_or_a_missing_one():
    now = [0.0]
    health, poller, _ = _health(now)
    health.lease_failed("StorageUnavailable: database is locked")
    assert health.reasons() == ["lease: cannot refresh the leader lease (StorageUnavailable: database is locked)"]
    health.lease_refreshed()
    assert health.reasons() == []
    now[0] = poller.last_cycle_at = 5.0  # half of the 8 s stale window without a refresh
    assert health.reasons() == ["lease: not refreshed for 5s"]


def test_journal_reason_from_inbound_batches_and_from_receipts():
    now = [0.0]
    health, _, receipts = _health(now)
    health.journal_failed("write failed: database or disk is full")
    assert health.reasons() == ["journal: cannot write (write failed: database or disk is full)"]
    health.journal_written()
    receipts.journal_error = "receipts not recorded (StorageUnavailable)"
    assert health.reasons() == ["journal: cannot write (receipts not recorded (StorageUnavailable))"]
    receipts.journal_error = None
    assert health.reasons() == []
