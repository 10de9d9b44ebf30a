"""Admission ledger: leases that exclude the retirement fence, and the one retirement fence.

Leases never exclude each other; they exist so that a destructive retirement (deleting an inactive
binding's topic to free its slot) cannot start while an operation that might touch that binding is
in flight — and so that no ordinary operation starts while a retirement is fenced. Lease ids are
derived from (operation id, scope), so retrying an operation with the same id resumes a lease whose
acquisition acknowledgement was lost instead of orphaning it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from topicbus.storage.db import Authority, Database, Transaction

T = TypeVar("T")

FENCE_PHASES = ("fenced", "deletion-issued", "commit-ready", "deletion-rejected")


class AdmissionError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class AdmissionBlocked(AdmissionError):
    def __init__(self) -> None:
        super().__init__("admission-blocked", "Workspace operation is blocked by retirement.")


@dataclass(frozen=True)
class Scope:
    kind: str  # 'profile' | 'chat' | 'target'
    chat_id: int | None = None
    thread_id: int | None = None

    @property
    def key(self) -> str:
        if self.kind == "profile":
            return "profile"
        if self.kind == "chat":
            return f"chat:{self.chat_id}"
        return f"target:{self.chat_id}:{self.thread_id}"

    def conflicts_with(self, chat_id: int, thread_id: int) -> bool:
        if self.kind == "profile":
            return True
        if self.kind == "chat":
            return self.chat_id == chat_id
        return self.chat_id == chat_id and self.thread_id == thread_id

    @staticmethod
    def parse(key: str) -> Scope:
        parts = key.split(":")
        if parts[0] == "chat":
            return Scope("chat", int(parts[1]))
        if parts[0] == "target":
            return Scope("target", int(parts[1]), int(parts[2]))
        return Scope("profile")


PROFILE = Scope("profile")


@dataclass(frozen=True)
class Lease:
    id: str
    operation_id: str
    operation_kind: str
    scope: str
    owner: str
    acquired_at_ms: int


@dataclass(frozen=True)
class Fence:
    operation_id: str
    retirement_intent_id: str
    binding_key: str
    slot: str
    chat_id: int
    thread_id: int
    leader_epoch: int
    owner: str
    phase: str
    acquired_at_ms: int
    deletion_issued_at_ms: int | None
    resolved_at_ms: int | None


def lease_id(operation_id: str, scope: Scope) -> str:
    return "admission:" + hashlib.sha256(f"{operation_id}\0{scope.key}".encode()).hexdigest()


class AdmissionLedger:
    def __init__(self, db: Database, owner: str, now_ms: Callable[[], int]):
        self._db = db
        self.owner = owner
        self._now_ms = now_ms
        self._active: set[str] = set()

    # --- leases -----------------------------------------------------------------------------------
    async def leases(self) -> list[Lease]:
        return [Lease(**dict(r)) for r in await self._db.fetch_all("SELECT * FROM admission_leases ORDER BY id")]

    async def drop_foreign_leases(self, authority: Authority | None = None) -> int:
        """A new leader term: leases of any other owner belong to a leader that lost authority."""
        async with self._db.write(authority) as tx:
            return await tx.execute("DELETE FROM admission_leases WHERE owner != ?", (self.owner,))

    async def acquire(self, operation_id: str, operation_kind: str, scope: Scope) -> tuple[Lease, bool]:
        """Acquire (or resume) one lease; raises AdmissionBlocked when a fence conflicts."""
        lid = lease_id(operation_id, scope)
        async with self._db.write() as tx:
            row = await tx.fetch_one("SELECT * FROM admission_leases WHERE id = ?", (lid,))
            if row is not None:
                lease = Lease(**dict(row))
                if (lease.operation_kind, lease.scope, lease.owner) != (operation_kind, scope.key, self.owner):
                    raise AdmissionError("authority-changed", "Admission operation identity changed.")
                return lease, True
            fence = await _fence_tx(tx)
            if fence is not None and scope.conflicts_with(fence.chat_id, fence.thread_id):
                raise AdmissionBlocked()
            lease = Lease(lid, operation_id, operation_kind, scope.key, self.owner, self._now_ms())
            await tx.execute("INSERT INTO admission_leases VALUES (?, ?, ?, ?, ?, ?)",
                             (lease.id, lease.operation_id, lease.operation_kind, lease.scope, lease.owner,
                              lease.acquired_at_ms))
            return lease, False

    async def release(self, lease: Lease) -> bool:
        async with self._db.write() as tx:
            return await tx.execute("DELETE FROM admission_leases WHERE id = ? AND owner = ?",
                                    (lease.id, self.owner)) > 0

    async def run(self, operation_id: str, operation_kind: str, scopes: Sequence[Scope],
                  op: Callable[[], Awaitable[T]]) -> T:
        """Run ``op`` while holding one lease per scope (sorted, deduplicated); always released."""
        if not operation_id or len(operation_id) > 512 or not scopes:
            raise AdmissionError("invalid-input", "Admitted operation is invalid.")
        if operation_id in self._active:
            raise AdmissionError("invalid-state", "Workspace admission operation is already active.")
        self._active.add(operation_id)
        held: list[Lease] = []
        try:
            for scope in sorted({s.key: s for s in scopes}.values(), key=lambda s: s.key):
                lease, _ = await self.acquire(operation_id, operation_kind, scope)
                held.append(lease)
            return await op()
        finally:
            for lease in reversed(held):
                try:
                    await self.release(lease)
                except Exception:  # noqa: BLE001 - a release failure never changes the outcome
                    pass
            self._active.discard(operation_id)

    # --- the retirement fence ----------------------------------------------------------------------
    async def fence(self) -> Fence | None:
        row = await self._db.fetch_one("SELECT * FROM retirement_fence WHERE id = 1")
        return None if row is None else _fence_row(row)

    async def acquire_fence(self, *, operation_id: str, intent_id: str, binding_key: str, slot: str, chat_id: int,
                            thread_id: int, leader_epoch: int) -> Fence | str:
        """Fence one retirement; returns the fence, or the blocking reason."""
        async with self._db.write() as tx:
            existing = await _fence_tx(tx)
            if existing is not None:
                if existing.operation_id == operation_id and existing.phase == "fenced":
                    return existing
                return "fence-conflict"
            for row in await tx.fetch_all("SELECT scope FROM admission_leases"):
                if Scope.parse(row["scope"]).conflicts_with(chat_id, thread_id):
                    return "admission-active"
            now = self._now_ms()
            await tx.execute(
                """INSERT INTO retirement_fence (id, operation_id, retirement_intent_id, binding_key, slot, chat_id,
                       thread_id, leader_epoch, owner, phase, acquired_at_ms) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, 'fenced', ?)""",
                (operation_id, intent_id, binding_key, slot, chat_id, thread_id, leader_epoch, self.owner, now))
            fence = await _fence_tx(tx)
            assert fence is not None
            return fence

    async def set_phase(self, expected: Fence, phase: str, *, from_phases: Sequence[str]) -> Fence | None:
        """Compare-and-set the fence phase; None when the stored fence is not ``expected`` any more."""
        assert phase in FENCE_PHASES
        async with self._db.write() as tx:
            current = await _fence_tx(tx)
            if current is None or current.operation_id != expected.operation_id or current.owner != self.owner:
                return None
            if current.phase == phase:
                return current
            if current.phase not in from_phases:
                return None
            now = self._now_ms()
            stamp = "deletion_issued_at_ms" if phase == "deletion-issued" else "resolved_at_ms"
            await tx.execute(f"UPDATE retirement_fence SET phase = ?, {stamp} = ? WHERE id = 1", (phase, now))
            return await _fence_tx(tx)

    async def adopt(self, expected: Fence, leader_epoch: int) -> Fence | None:
        async with self._db.write() as tx:
            current = await _fence_tx(tx)
            if current is None or current.operation_id != expected.operation_id:
                return None
            await tx.execute("UPDATE retirement_fence SET owner = ?, leader_epoch = ? WHERE id = 1",
                             (self.owner, leader_epoch))
            return await _fence_tx(tx)

    async def remove_fence(self, expected: Fence, *, phases: Sequence[str]) -> bool:
        async with self._db.write() as tx:
            return await self.remove_fence_tx(tx, expected, phases=phases)

    async def remove_fence_tx(self, tx: Transaction, expected: Fence, *, phases: Sequence[str]) -> bool:
        current = await _fence_tx(tx)
        if current is None or current.operation_id != expected.operation_id or current.phase not in phases:
            return False
        await tx.execute("DELETE FROM retirement_fence WHERE id = 1")
        return True


async def _fence_tx(tx: Transaction) -> Fence | None:
    row = await tx.fetch_one("SELECT * FROM retirement_fence WHERE id = 1")
    return None if row is None else _fence_row(row)


def _fence_row(row) -> Fence:
    data = dict(row)
    data.pop("id", None)
    return Fence(**data)
