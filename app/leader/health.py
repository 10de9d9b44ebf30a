"""Honest health: why the leader is not doing its job right now.

``/healthz`` answers 503 with these reasons while any holds, and 200 again once they are gone
(docs/operations.md, "Health"):

* **polling** — the poll loop has not completed a ``getUpdates`` batch within its deadline (an
  empty answer counts; a batch counts once it is journaled), or it stopped;
* **lease** — the last lease refresh failed, or none succeeded for half the lease's stale window
  (a standby would soon take over);
* **journal** — the last attempt to journal owner messages, or to record followers' receipts,
  failed (a full disk, a locked or read-only database).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class PollProgress(Protocol):
    @property
    def done(self) -> bool: ...

    @property
    def last_cycle_at(self) -> float: ...


class ReceiptJournal(Protocol):
    @property
    def journal_error(self) -> str | None: ...


class LeaderHealth:
    def __init__(self, *, poll_deadline_s: float, lease_stale_after_ms: int, poll_timeout_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        # A long poll may legitimately take poll_timeout_s: the deadline is never shorter than that.
        self.poll_deadline_s = max(poll_deadline_s, poll_timeout_s * 1.5 + 2.0)
        self.lease_deadline_s = lease_stale_after_ms / 2000
        self._clock = clock
        self._poller: PollProgress | None = None
        self._receipts: ReceiptJournal | None = None
        self._lease_ok_at = clock()
        self._lease_error: str | None = None
        self._journal_error: str | None = None

    # --- a term --------------------------------------------------------------------------------
    def begin_term(self, poller: PollProgress, receipts: ReceiptJournal) -> None:
        self._poller, self._receipts = poller, receipts
        self._lease_ok_at = self._clock()
        self._lease_error = self._journal_error = None

    def end_term(self) -> None:
        self._poller = self._receipts = None

    # --- what the leader reports ---------------------------------------------------------------
    def lease_refreshed(self) -> None:
        self._lease_ok_at = self._clock()
        self._lease_error = None

    def lease_failed(self, error: str) -> None:
        self._lease_error = error

    def journal_written(self) -> None:
        self._journal_error = None

    def journal_failed(self, error: str) -> None:
        self._journal_error = error

    # --- the verdict ---------------------------------------------------------------------------
    def reasons(self) -> list[str]:
        now = self._clock()
        found = []
        poller = self._poller
        if poller is not None:
            age = now - poller.last_cycle_at
            if poller.done:
                found.append("polling: the poll loop stopped")
            elif age > self.poll_deadline_s:
                found.append(f"polling: no getUpdates batch completed for {age:.0f}s "
                             f"(deadline {self.poll_deadline_s:g}s)")
        lease_age = now - self._lease_ok_at
        if self._lease_error is not None:
            found.append(f"lease: cannot refresh the leader lease ({self._lease_error})")
        elif lease_age > self.lease_deadline_s:
            found.append(f"lease: not refreshed for {lease_age:.0f}s")
        journal = self._journal_error or (self._receipts.journal_error if self._receipts is not None else None)
        if journal is not None:
            found.append(f"journal: cannot write ({journal})")
        return found
