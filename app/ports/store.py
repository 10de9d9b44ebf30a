"""The store port: what the leader's use cases read and write, and the unit of work.

Every write runs under the leader's :class:`~topicbus.core.authority.Authority`, and the store
re-checks it inside the transaction (:class:`~topicbus.core.authority.AuthorityLost` when the lease
changed hands). Two ways to write:

* ``async with store.unit_of_work(authority) as uow:`` — several writes that commit together,
  through the repositories the unit of work yields (``uow.bindings``, ``uow.outbox`` …);
* a repository's own write methods (``store.journal.append_many(…, authority)``), each one
  transaction (or one self-fenced statement).

Reads go through the store's repositories (``store.bindings.get(…)``). The records are the core's
(``core/bindings``, ``core/journal``, ``core/keyboards``, ``core/cleanups``, ``core/admission``,
``core/retirement``). Implemented by ``storage/store.SqliteStore``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from topicbus.core.target import Target
from topicbus.core.admission import AdmissionHold, Fence, Scope
from topicbus.core.authority import Authority
from topicbus.core.bindings import Binding, OwnerRecord
from topicbus.core.budget import Priority
from topicbus.core.formatting import Rendered
from topicbus.core.records import Button, InboundItem, OutboxItem
from topicbus.core.cleanups import CleanupIntent, ScheduledCleanup
from topicbus.core.journal import JournalItem, JournalRow
from topicbus.core.keyboards import Keyboard
from topicbus.core.output import QueuedItem, TopicBacklog
from topicbus.core.retirement import RetirementIntent

T = TypeVar("T")


class Bindings(Protocol):
    """Workspace bindings and their owner records, read outside a transaction."""

    async def all(self) -> list[Binding]: ...

    async def get(self, binding_key: str) -> Binding | None: ...

    async def by_target(self, topic: Target) -> Binding | None: ...

    async def owners(self) -> list[OwnerRecord]: ...

    async def owner(self, binding_key: str) -> OwnerRecord | None: ...


class BindingsInTransaction(Protocol):
    """Bindings and owner records inside a unit of work."""

    async def get(self, binding_key: str) -> Binding | None: ...

    async def delete(self, binding_key: str) -> None:
        """A retired binding: its slot letter is free again (rotation commit)."""
        ...

    async def slots(self) -> dict[str, str]:
        """binding key → slot letter, for every binding that holds a slot."""
        ...

    async def insert(self, b: Binding) -> None: ...

    async def set_topic(self, binding_key: str, *, thread_id: int, display_title: str | None, now_ms: int) -> None:
        """Point a binding at a (re)created topic: open, active, title as created."""
        ...

    async def mark_active(self, binding_key: str) -> None: ...

    async def mark_inactive(self, binding_key: str, at_ms: int) -> bool:
        """Record the first proof that nobody owns this binding (first proof wins)."""
        ...

    async def mark_topic_deleted(self, topic: Target, at_ms: int) -> str | None:
        """The topic is gone: the binding keeps slot and name, loses its owner, becomes inactive."""
        ...

    async def set_topic_state(self, binding_key: str, state: str) -> None: ...

    async def set_display_title(self, binding_key: str, title: str) -> None: ...

    async def set_manual_name(self, binding_key: str, name: str) -> None:
        """The title an owner gave the topic in Telegram; every display mode keeps it."""
        ...

    async def set_offline_notified(self, binding_key: str) -> bool: ...

    async def owner(self, binding_key: str) -> OwnerRecord | None: ...

    async def set_owner(self, owner: OwnerRecord) -> None: ...

    async def detach_owner(self, expected: OwnerRecord) -> bool:
        """Compare-and-delete the exact owner record."""
        ...


class Journal(Protocol):
    """The inbound journal: owner items kept until their follower's receipt (each write its own transaction)."""

    async def append(self, update_id: int, binding_key: str, payload: InboundItem, now_ms: int,
                     authority: Authority) -> JournalItem | None:
        """Journal one routed update; ``None`` when that update was already journaled."""
        ...

    async def append_many(self, rows: Sequence[JournalRow], now_ms: int, authority: Authority, *,
                          held: Collection[int] = ()) -> list[JournalItem]: ...

    async def pending(self, binding_key: str, limit: int = 500, after_seq: int = 0) -> list[JournalItem]: ...

    async def mark_delivered(self, seq: int, binding_key: str, now_ms: int, authority: Authority) -> bool: ...

    async def mark_delivered_many(self, receipts: list[tuple[int, str]], now_ms: int, authority: Authority) -> int:
        """Apply follower receipts (seq, binding key) in one transaction; returns how many were new."""
        ...

    async def settle_receipts(self, receipts: Sequence[tuple[int, str]], now_ms: int,
                              authority: Authority) -> list[JournalItem]: ...

    async def settle(self, seq: int, binding_key: str, status: str, now_ms: int, authority: Authority) -> bool:
        """Settle one waiting row without a receipt (``skipped`` or ``expired``)."""
        ...

    async def count_gathering(self, binding_key: str, media_group: str) -> int: ...

    async def gathering_groups(self) -> list[tuple[str, str]]:
        """(binding key, media group) of every album still gathering (e.g. left by a crashed leader)."""
        ...

    async def seal_group(self, binding_key: str, media_group: str,
                         combine: Callable[[list[InboundItem]], InboundItem], now_ms: int,
                         authority: Authority, *, parts_per_item: int | None = None) -> list[JournalItem]: ...

    async def held_for_transcript(self) -> list[JournalItem]: ...

    async def drop_waiting(self, binding_key: str, now_ms: int, authority: Authority) -> int:
        """``/drop``: every row still waiting for this binding's follower is dropped."""
        ...

    async def expire_older_than(self, cutoff_ms: int, now_ms: int, authority: Authority) -> int:
        """Rows journaled before ``cutoff_ms`` and still pending expire (the topic is told later)."""
        ...

    async def unreported_expired(self) -> dict[str, list[JournalItem]]:
        """Expired rows the topic was not told about yet, by binding, in journal order."""
        ...

    async def mark_reported(self, seqs: Sequence[int], now_ms: int, authority: Authority) -> None: ...

    async def has_file(self, file_id: str) -> bool: ...

    async def count_waiting_entries(self, binding_key: str) -> int: ...

    async def count_pending(self) -> dict[str, int]: ...

    async def purge_delivered(self, older_than_ms: int, authority: Authority) -> int:
        """Drop settled rows (delivered, merged, skipped, dropped, expired and reported) older than the cutoff."""
        ...


class JournalInTransaction(Protocol):
    """The journal inside a unit of work."""

    async def append(self, update_id: int, binding_key: str, payload: InboundItem, now_ms: int, *,
                     for_instance: str | None = None) -> JournalItem | None: ...

    async def release_held(self, seq: int, binding_key: str, payload: InboundItem | None) -> bool:
        """A held voice note becomes ``pending`` (deliverable), with ``payload`` (its transcript item)"""
        ...


class Outbox(Protocol):
    """The durable outbox: what goes out to Telegram, topic by topic (each write its own transaction)."""

    async def enqueue(self, *, binding_key: str, chat_id: int, thread_id: int | None, instance_id: str,
                      request_id: str, item: OutboxItem, now_ms: int, authority: Authority,
                      priority: Priority = Priority.OUTPUT, units: int = 0, fmt: str | None = None,
                      has_buttons: bool = False) -> tuple[int, bool]:
        """Store one item; idempotent per (instance_id, request_id). Returns (id, newly_added)."""
        ...

    async def topics(self) -> list[TopicBacklog]: ...

    async def heads(self, topic: Target, limit: int = 256) -> list[QueuedItem]: ...

    async def payloads(self, ids: Sequence[int]) -> dict[int, OutboxItem]:
        """The items of these rows (a row gone, or of a kind this version does not know, is left out)."""
        ...

    def item_size(self, item: OutboxItem) -> int:
        """The bytes an item takes in its row (the backlog cap counts these)."""
        ...

    async def origin(self, item_id: int) -> tuple[str, str, str] | None:
        """(binding key, instance id, kind) of one row: whose output it is."""
        ...

    async def backlog_of(self, binding_key: str) -> tuple[int, int]:
        """(pending items, pending payload bytes) of one binding."""
        ...

    async def backlog_by_binding(self) -> dict[str, tuple[int, int]]:
        """binding key → (pending items, pending payload bytes)."""
        ...

    async def mark_sent(self, ids: Sequence[int], now_ms: int, message_id: int | None, authority: Authority) -> None:
        """The rows one Telegram message (or edit, or file) carried: sent, together."""
        ...

    async def mark_failed(self, item_id: int, error: str, authority: Authority) -> None: ...

    async def note_attempt(self, item_id: int, error: str, authority: Authority) -> None: ...

    async def fail_unbound(self, topic: Target, error: str, authority: Authority) -> int: ...

    async def pending_in(self, topic: Target) -> int:
        """Rows still to go out into one topic (a topic is closed or deleted only at 0)."""
        ...

    async def count_pending(self) -> int: ...

    async def pending_binding_keys(self) -> set[str]: ...

    async def purge_sent(self, older_than_ms: int, authority: Authority) -> int: ...


class OutboxInTransaction(Protocol):
    """The outbox inside a unit of work."""

    async def enqueue(self, *, binding_key: str, chat_id: int, thread_id: int | None, instance_id: str,
                      request_id: str, item: OutboxItem, now_ms: int,
                      priority: Priority = Priority.OUTPUT, units: int = 0, fmt: str | None = None,
                      has_buttons: bool = False) -> tuple[int, bool]:
        """:meth:`enqueue` inside a caller's unit of work (with what must commit with it)."""
        ...

    async def retarget(self, binding_key: str, thread_id: int) -> int:
        """A binding got a new topic: its undelivered output goes there. Returns the rows moved."""
        ...


class StoredKeyboards(Protocol):
    """The inline keyboards under the leader's messages."""

    async def get(self, token: str) -> Keyboard | None: ...

    async def make(self, *, kind: str, outbox_id: int, binding_key: str, instance_id: str, generation: str,
                   takes_presses: bool | None, chat_id: int, thread_id: int | None,
                   buttons: tuple[tuple[Button, ...], ...], now_ms: int, authority: Authority) -> Keyboard: ...

    async def set_message(self, token: str, message_id: int, authority: Authority) -> None:
        """Telegram accepted the message that carries this keyboard."""
        ...

    async def mark_shown(self, token: str, now_ms: int, authority: Authority) -> None: ...

    async def unshown(self, since_ms: int) -> list[Keyboard]:
        """Answered keyboards whose message does not show the choice yet (answered after ``since_ms``)."""
        ...

    async def purge(self, older_than_ms: int, authority: Authority) -> int: ...


class StoredKeyboardsInTransaction(Protocol):
    """StoredKeyboards inside a unit of work."""

    async def claim(self, token: str, *, update_id: int, index: int, user_id: int, now_ms: int,
                    message_id: int | None, shown: Rendered | None) -> bool: ...


class CleanupIntents(Protocol):
    """Durable cleanup intents, written before any Telegram close/delete."""

    async def all(self) -> list[CleanupIntent]: ...


class CleanupIntentsInTransaction(Protocol):
    """Cleanup intents inside a unit of work."""

    async def upsert(self, intent: CleanupIntent) -> None: ...

    async def remove(self, intent_id: str) -> None: ...

    async def note_error(self, intent_id: str, error: str) -> None: ...


class CleanupSchedule(Protocol):
    """Topics of finished agents kept for their grace period."""

    async def all(self) -> list[ScheduledCleanup]: ...

    async def get(self, binding_key: str) -> ScheduledCleanup | None: ...


class CleanupScheduleInTransaction(Protocol):
    """Scheduled cleanups inside a unit of work."""

    async def put(self, cleanup: ScheduledCleanup) -> None:
        """Schedule (or re-schedule: one row per binding, the later departure wins)."""
        ...

    async def remove(self, binding_key: str) -> None: ...


class RetirementIntents(Protocol):
    """Retirement intents: "this exact inactive binding is being retired"."""

    async def all(self) -> list[RetirementIntent]: ...


class RetirementIntentsInTransaction(Protocol):
    """Retirement intents inside a unit of work."""

    async def insert(self, intent: RetirementIntent) -> None: ...

    async def remove(self, intent_id: str) -> bool: ...

    async def set_epoch(self, intent_id: str, epoch: int) -> None: ...


class RuntimeSettings(Protocol):
    """Settings changed from Telegram (``core/runtime_settings`` names them)."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str, now_ms: int, authority: Authority) -> None: ...

    async def reset(self, key: str, authority: Authority) -> None: ...


class Admission(Protocol):
    """The admission ledger: holds that exclude the retirement fence, and the one fence."""

    @property
    def owner(self) -> str:
        """The lease owner whose holds these are."""
        ...

    async def holds(self) -> list[AdmissionHold]: ...

    async def drop_foreign_holds(self, authority: Authority) -> int:
        """A new leader term: holds of any other owner belong to a leader that lost authority."""
        ...

    async def acquire(self, operation_id: str, operation_kind: str, scope: Scope,
                      authority: Authority) -> tuple[AdmissionHold, bool]:
        """Acquire (or resume) one hold; raises AdmissionBlocked when a fence conflicts."""
        ...

    async def release(self, hold: AdmissionHold, authority: Authority) -> bool: ...

    async def run(self, operation_id: str, operation_kind: str, scopes: Sequence[Scope],
                  op: Callable[[], Awaitable[T]]) -> T:
        """Run ``op`` while holding one hold per scope (sorted, deduplicated); always released."""
        ...

    async def fence(self) -> Fence | None: ...

    async def acquire_fence(self, authority: Authority, *, operation_id: str, intent_id: str, binding_key: str,
                            slot: str, chat_id: int, thread_id: int, leader_epoch: int) -> Fence | str:
        """Fence one retirement; returns the fence, or the blocking reason."""
        ...

    async def set_phase(self, authority: Authority, expected: Fence, phase: str, *,
                        from_phases: Sequence[str]) -> Fence | None:
        """Compare-and-set the fence phase; None when the stored fence is not ``expected`` any more."""
        ...

    async def adopt(self, authority: Authority, expected: Fence) -> Fence | None: ...

    async def remove_fence(self, authority: Authority, expected: Fence, *, phases: Sequence[str]) -> bool: ...


class AdmissionInTransaction(Protocol):
    """The retirement fence inside a unit of work."""

    async def remove_fence(self, expected: Fence, *, phases: Sequence[str]) -> bool: ...


class UnitOfWork(Protocol):
    """One write transaction under an authority: its repositories' writes commit together, or none
    does (an exception rolls it back)."""

    @property
    def bindings(self) -> BindingsInTransaction: ...

    @property
    def journal(self) -> JournalInTransaction: ...

    @property
    def outbox(self) -> OutboxInTransaction: ...

    @property
    def keyboards(self) -> StoredKeyboardsInTransaction: ...

    @property
    def cleanups(self) -> CleanupIntentsInTransaction: ...

    @property
    def scheduled_cleanups(self) -> CleanupScheduleInTransaction: ...

    @property
    def retirements(self) -> RetirementIntentsInTransaction: ...

    @property
    def admission(self) -> AdmissionInTransaction: ...


class Store(Protocol):
    """The leader's store: its repositories, and units of work under an authority."""

    @property
    def bindings(self) -> Bindings: ...

    @property
    def journal(self) -> Journal: ...

    @property
    def outbox(self) -> Outbox: ...

    @property
    def keyboards(self) -> StoredKeyboards: ...

    @property
    def cleanups(self) -> CleanupIntents: ...

    @property
    def scheduled_cleanups(self) -> CleanupSchedule: ...

    @property
    def retirements(self) -> RetirementIntents: ...

    @property
    def settings(self) -> RuntimeSettings: ...

    def unit_of_work(self, authority: Authority) -> AbstractAsyncContextManager[UnitOfWork]:
        """A write transaction under ``authority``; raises AuthorityLost when the lease changed hands."""
        ...
