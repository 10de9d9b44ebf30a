"""Admission ledger: holds that exclude the retirement fence, and the one retirement fence.

Holds never exclude each other; they exist so that a destructive retirement (deleting an inactive
binding's topic to free its slot) cannot start while an operation that might touch that binding is
in flight — and so that no ordinary operation starts while a retirement is fenced. Hold ids are
derived from (operation id, scope), so retrying an operation with the same id resumes a hold whose
acquisition acknowledgement was lost instead of orphaning it.

Every write carries the leader's authority: a unit of work, or (a hold's release) one self-fenced
statement. :meth:`AdmissionLedger.run` captures the authority when the operation starts and uses
it for the hold and its release; the fence operations take the authority of the rotation that
drives them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from topicbus.core.admission import (FENCE_PHASES, AdmissionBlocked, AdmissionError, AdmissionHold, Fence,
                                     Scope, hold_id)
from topicbus.core.authority import Authority
from topicbus.storage.db import Database, UnitOfWork

T = TypeVar("T")


class AdmissionLedger:
    def __init__(self, db: Database, owner: str, now_ms: Callable[[], int], authority: Callable[[], Authority]):
        self._db = db
        self.owner = owner
        self._now_ms = now_ms
        self._authority = authority  # the term's current authority (raises when the lease is lost)
        self._active: set[str] = set()

    # --- holds ------------------------------------------------------------------------------------
    async def holds(self) -> list[AdmissionHold]:
        return [AdmissionHold(**dict(r))
                for r in await self._db.fetch_all("SELECT * FROM admission_holds ORDER BY id")]

    async def drop_foreign_holds(self, authority: Authority) -> int:
        """A new leader term: holds of any other owner belong to a leader that lost authority."""
        async with self._db.unit_of_work(authority) as uow:
            return await uow.execute("DELETE FROM admission_holds WHERE owner != ?", (self.owner,))

    async def acquire(self, operation_id: str, operation_kind: str, scope: Scope,
                      authority: Authority) -> tuple[AdmissionHold, bool]:
        """Acquire (or resume) one hold; raises AdmissionBlocked when a fence conflicts."""
        hid = hold_id(operation_id, scope)
        async with self._db.unit_of_work(authority) as uow:
            row = await uow.fetch_one("SELECT * FROM admission_holds WHERE id = ?", (hid,))
            if row is not None:
                hold = AdmissionHold(**dict(row))
                if (hold.operation_kind, hold.scope, hold.owner) != (operation_kind, scope.key, self.owner):
                    raise AdmissionError("authority-changed", "Admission operation identity changed.")
                return hold, True
            fence = await _fence_tx(uow)
            if fence is not None and scope.conflicts_with(fence.chat_id, fence.thread_id):
                raise AdmissionBlocked()
            hold = AdmissionHold(hid, operation_id, operation_kind, scope.key, self.owner, self._now_ms())
            await uow.execute("INSERT INTO admission_holds VALUES (?, ?, ?, ?, ?, ?)",
                              (hold.id, hold.operation_id, hold.operation_kind, hold.scope, hold.owner,
                               hold.acquired_at_ms))
            return hold, False

    async def release(self, hold: AdmissionHold, authority: Authority) -> bool:
        """Give a hold back in one self-fenced statement (one worker-thread hop, every admitted
        operation pays it): nothing is deleted unless the lease still names ``authority``."""
        rows = await self._db.self_fenced_statement(
            "DELETE FROM admission_holds WHERE id = ? AND owner = ? AND {authority_check} RETURNING id",
            (hold.id, self.owner), authority)
        return bool(rows)

    async def run(self, operation_id: str, operation_kind: str, scopes: Sequence[Scope],
                  op: Callable[[], Awaitable[T]]) -> T:
        """Run ``op`` while holding one hold per scope (sorted, deduplicated); always released.
        The holds are taken and released under the authority current when the operation starts."""
        if not operation_id or len(operation_id) > 512 or not scopes:
            raise AdmissionError("invalid-input", "Admitted operation is invalid.")
        if operation_id in self._active:
            raise AdmissionError("invalid-state", "Workspace admission operation is already active.")
        authority = self._authority()
        self._active.add(operation_id)
        held: list[AdmissionHold] = []
        try:
            for scope in sorted({s.key: s for s in scopes}.values(), key=lambda s: s.key):
                hold, _ = await self.acquire(operation_id, operation_kind, scope, authority)
                held.append(hold)
            return await op()
        finally:
            for hold in reversed(held):
                try:
                    await self.release(hold, authority)
                except Exception:  # noqa: BLE001 - a release failure never changes the outcome
                    pass
            self._active.discard(operation_id)

    # --- the retirement fence ----------------------------------------------------------------------
    async def fence(self) -> Fence | None:
        row = await self._db.fetch_one("SELECT * FROM retirement_fence WHERE id = 1")
        return None if row is None else _fence_row(row)

    async def acquire_fence(self, authority: Authority, *, operation_id: str, intent_id: str, binding_key: str, slot: str, chat_id: int,
                            thread_id: int, leader_epoch: int) -> Fence | str:
        """Fence one retirement; returns the fence, or the blocking reason."""
        async with self._db.unit_of_work(authority) as uow:
            existing = await _fence_tx(uow)
            if existing is not None:
                if existing.operation_id == operation_id and existing.phase == "fenced":
                    return existing
                return "fence-conflict"
            for row in await uow.fetch_all("SELECT scope FROM admission_holds"):
                if Scope.parse(row["scope"]).conflicts_with(chat_id, thread_id):
                    return "admission-active"
            now = self._now_ms()
            await uow.execute(
                """INSERT INTO retirement_fence (id, operation_id, retirement_intent_id, binding_key, slot, chat_id,
                       thread_id, leader_epoch, owner, phase, acquired_at_ms) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, 'fenced', ?)""",
                (operation_id, intent_id, binding_key, slot, chat_id, thread_id, leader_epoch, self.owner, now))
            fence = await _fence_tx(uow)
            assert fence is not None
            return fence

    async def set_phase(self, authority: Authority, expected: Fence, phase: str, *,
                        from_phases: Sequence[str]) -> Fence | None:
        """Compare-and-set the fence phase; None when the stored fence is not ``expected`` any more."""
        assert phase in FENCE_PHASES
        async with self._db.unit_of_work(authority) as uow:
            current = await _fence_tx(uow)
            if current is None or current.operation_id != expected.operation_id or current.owner != self.owner:
                return None
            if current.phase == phase:
                return current
            if current.phase not in from_phases:
                return None
            now = self._now_ms()
            stamp = "deletion_issued_at_ms" if phase == "deletion-issued" else "resolved_at_ms"
            await uow.execute(f"UPDATE retirement_fence SET phase = ?, {stamp} = ? WHERE id = 1", (phase, now))
            return await _fence_tx(uow)

    async def adopt(self, authority: Authority, expected: Fence) -> Fence | None:
        leader_epoch = authority.epoch
        async with self._db.unit_of_work(authority) as uow:
            current = await _fence_tx(uow)
            if current is None or current.operation_id != expected.operation_id:
                return None
            await uow.execute("UPDATE retirement_fence SET owner = ?, leader_epoch = ? WHERE id = 1",
                             (self.owner, leader_epoch))
            return await _fence_tx(uow)

    async def remove_fence(self, authority: Authority, expected: Fence, *, phases: Sequence[str]) -> bool:
        async with self._db.unit_of_work(authority) as uow:
            return await self.remove_fence_tx(uow, expected, phases=phases)

    @staticmethod
    async def remove_fence_tx(uow: UnitOfWork, expected: Fence, *, phases: Sequence[str]) -> bool:
        current = await _fence_tx(uow)
        if current is None or current.operation_id != expected.operation_id or current.phase not in phases:
            return False
        await uow.execute("DELETE FROM retirement_fence WHERE id = 1")
        return True


async def _fence_tx(uow: UnitOfWork) -> Fence | None:
    row = await uow.fetch_one("SELECT * FROM retirement_fence WHERE id = 1")
    return None if row is None else _fence_row(row)


def _fence_row(row) -> Fence:
    data = dict(row)
    data.pop("id", None)
    return Fence(**data)
