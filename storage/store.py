"""The SQLite store: the Store port (``ports/store.py``) over one :class:`~topicbus.storage.db.Database`.

Its repositories are built once; a unit of work yields the same repositories bound to its
transaction (their ``*_tx`` methods), so a use case writes ``uow.bindings.set_owner(…)`` and never
sees SQL or the connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import cached_property
from typing import Any

from topicbus.core.target import Target
from topicbus.core.admission import Fence
from topicbus.core.authority import Authority
from topicbus.core.bindings import Binding, OwnerRecord
from topicbus.core.budget import Priority
from topicbus.core.cleanups import CleanupIntent, ScheduledCleanup
from topicbus.core.journal import JournalItem
from topicbus.core.retirement import RetirementIntent
from topicbus.core.formatting import Rendered
from topicbus.core.records import InboundItem, OutboxItem
from topicbus.storage.admission import AdmissionLedger
from topicbus.storage.bindings import BindingRepository
from topicbus.storage.cleanups import CleanupRepository, ScheduledCleanupRepository
from topicbus.storage.db import Database, UnitOfWork
from topicbus.storage.journal import JournalRepository
from topicbus.storage.keyboards import KeyboardRepository
from topicbus.storage.outbox import OutboxRepository
from topicbus.storage.retirement import RetirementRepository
from topicbus.storage.runtime_settings import RuntimeSettingsRepository


class SqliteStore:
    """The Store port over SQLite: one repository per table, and units of work."""

    def __init__(self, db: Database):
        self.db = db
        self.bindings = BindingRepository(db)
        self.journal = JournalRepository(db)
        self.outbox = OutboxRepository(db)
        self.keyboards = KeyboardRepository(db)
        self.cleanups = CleanupRepository(db)
        self.scheduled_cleanups = ScheduledCleanupRepository(db)
        self.retirements = RetirementRepository(db)
        self.settings = RuntimeSettingsRepository(db)

    def admission(self, owner: str, now_ms: Callable[[], int], authority: Callable[[], Authority]) -> AdmissionLedger:
        """The admission ledger of one leader (``owner``), its holds taken under ``authority()``."""
        return AdmissionLedger(self.db, owner, now_ms, authority)

    @asynccontextmanager
    async def unit_of_work(self, authority: Authority) -> AsyncIterator[SqliteUnitOfWork]:
        async with self.db.unit_of_work(authority) as uow:
            yield SqliteUnitOfWork(uow)


class SqliteUnitOfWork:
    """The repositories of one write transaction (each made when first used)."""

    def __init__(self, uow: UnitOfWork):
        self._uow = uow

    @cached_property
    def bindings(self) -> _BindingsInTransaction:
        return _BindingsInTransaction(self._uow)

    @cached_property
    def journal(self) -> _JournalInTransaction:
        return _JournalInTransaction(self._uow)

    @cached_property
    def outbox(self) -> _OutboxInTransaction:
        return _OutboxInTransaction(self._uow)

    @cached_property
    def keyboards(self) -> _KeyboardsInTransaction:
        return _KeyboardsInTransaction(self._uow)

    @cached_property
    def cleanups(self) -> _CleanupIntentsInTransaction:
        return _CleanupIntentsInTransaction(self._uow)

    @cached_property
    def scheduled_cleanups(self) -> _ScheduledCleanupsInTransaction:
        return _ScheduledCleanupsInTransaction(self._uow)

    @cached_property
    def retirements(self) -> _RetirementIntentsInTransaction:
        return _RetirementIntentsInTransaction(self._uow)

    @cached_property
    def admission(self) -> _AdmissionInTransaction:
        return _AdmissionInTransaction(self._uow)


class _BindingsInTransaction:
    def __init__(self, uow: UnitOfWork):
        self._uow = uow

    async def get(self, binding_key: str) -> Binding | None:
        return await BindingRepository.get_tx(self._uow, binding_key)

    async def delete(self, binding_key: str) -> None:
        return await BindingRepository.delete_tx(self._uow, binding_key)

    async def slots(self) -> dict[str, str]:
        return await BindingRepository.slots_tx(self._uow)

    async def insert(self, b: Binding) -> None:
        return await BindingRepository.insert_tx(self._uow, b)

    async def set_topic(self, binding_key: str, *, thread_id: int, display_title: str | None, now_ms: int) -> None:
        return await BindingRepository.set_topic_tx(self._uow, binding_key, thread_id=thread_id,
                                                    display_title=display_title, now_ms=now_ms)

    async def mark_active(self, binding_key: str) -> None:
        return await BindingRepository.mark_active_tx(self._uow, binding_key)

    async def mark_inactive(self, binding_key: str, at_ms: int) -> bool:
        return await BindingRepository.mark_inactive_tx(self._uow, binding_key, at_ms)

    async def mark_topic_deleted(self, topic: Target, at_ms: int) -> str | None:
        return await BindingRepository.mark_topic_deleted_tx(self._uow, topic, at_ms)

    async def set_topic_state(self, binding_key: str, state: str) -> None:
        return await BindingRepository.set_topic_state_tx(self._uow, binding_key, state)

    async def set_display_title(self, binding_key: str, title: str) -> None:
        return await BindingRepository.set_display_title_tx(self._uow, binding_key, title)

    async def set_manual_name(self, binding_key: str, name: str) -> None:
        return await BindingRepository.set_manual_name_tx(self._uow, binding_key, name)

    async def set_offline_notified(self, binding_key: str) -> bool:
        return await BindingRepository.set_offline_notified_tx(self._uow, binding_key)

    async def owner(self, binding_key: str) -> OwnerRecord | None:
        return await BindingRepository.owner_tx(self._uow, binding_key)

    async def set_owner(self, owner: OwnerRecord) -> None:
        return await BindingRepository.set_owner_tx(self._uow, owner)

    async def detach_owner(self, expected: OwnerRecord) -> bool:
        return await BindingRepository.detach_owner_tx(self._uow, expected)


class _JournalInTransaction:
    def __init__(self, uow: UnitOfWork):
        self._uow = uow

    async def append(self, update_id: int, binding_key: str, payload: InboundItem, now_ms: int, *,
                     for_instance: str | None = None) -> JournalItem | None:
        return await JournalRepository.append_tx(self._uow, update_id, binding_key, payload, now_ms,
                                                 for_instance=for_instance)

    async def release_held(self, seq: int, binding_key: str, payload: InboundItem | None) -> bool:
        return await JournalRepository.release_held_tx(self._uow, seq, binding_key, payload)


class _OutboxInTransaction:
    def __init__(self, uow: UnitOfWork):
        self._uow = uow

    async def enqueue(self, *, binding_key: str, chat_id: int, thread_id: int | None, instance_id: str,
                      request_id: str, item: OutboxItem, now_ms: int,
                      priority: Priority = Priority.OUTPUT, units: int = 0, fmt: str | None = None,
                      has_buttons: bool = False) -> tuple[int, bool]:
        return await OutboxRepository.enqueue_tx(self._uow, binding_key=binding_key, chat_id=chat_id,
                                                 thread_id=thread_id, instance_id=instance_id, request_id=request_id,
                                                 item=item, now_ms=now_ms, priority=priority,
                                                 units=units, fmt=fmt, has_buttons=has_buttons)

    async def retarget(self, binding_key: str, thread_id: int) -> int:
        return await OutboxRepository.retarget_tx(self._uow, binding_key, thread_id)


class _KeyboardsInTransaction:
    def __init__(self, uow: UnitOfWork):
        self._uow = uow

    async def claim(self, token: str, *, update_id: int, index: int, user_id: int, now_ms: int,
                    message_id: int | None, shown: Rendered | None) -> bool:
        return await KeyboardRepository.claim_tx(self._uow, token, update_id=update_id, index=index, user_id=user_id,
                                                 now_ms=now_ms, message_id=message_id, shown=shown)


class _CleanupIntentsInTransaction:
    def __init__(self, uow: UnitOfWork):
        self._uow = uow

    async def upsert(self, intent: CleanupIntent) -> None:
        return await CleanupRepository.upsert_tx(self._uow, intent)

    async def remove(self, intent_id: str) -> None:
        return await CleanupRepository.remove_tx(self._uow, intent_id)

    async def note_error(self, intent_id: str, error: str) -> None:
        return await CleanupRepository.note_error_tx(self._uow, intent_id, error)


class _ScheduledCleanupsInTransaction:
    def __init__(self, uow: UnitOfWork):
        self._uow = uow

    async def put(self, cleanup: ScheduledCleanup) -> None:
        return await ScheduledCleanupRepository.put_tx(self._uow, cleanup)

    async def remove(self, binding_key: str) -> None:
        return await ScheduledCleanupRepository.remove_tx(self._uow, binding_key)


class _RetirementIntentsInTransaction:
    def __init__(self, uow: UnitOfWork):
        self._uow = uow

    async def insert(self, intent: RetirementIntent) -> None:
        return await RetirementRepository.insert_tx(self._uow, intent)

    async def remove(self, intent_id: str) -> bool:
        return await RetirementRepository.remove_tx(self._uow, intent_id)

    async def set_epoch(self, intent_id: str, epoch: int) -> None:
        return await RetirementRepository.set_epoch_tx(self._uow, intent_id, epoch)


class _AdmissionInTransaction:
    def __init__(self, uow: UnitOfWork):
        self._uow = uow

    async def remove_fence(self, expected: Fence, *, phases: Sequence[str]) -> bool:
        return await AdmissionLedger.remove_fence_tx(self._uow, expected, phases=phases)
