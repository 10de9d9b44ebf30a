"""What happens to the topic of a follower that is gone for good.

* **Cleanup** (policy on; proven death or graceful disconnect): durable intent first, then close and
  delete the topic, then mark the binding's topic deleted and the binding inactive, then drop the
  intent. An unconfirmed deletion keeps the intent and the binding and says so.
* **Preservation** (policy off; proven death): detach the routeable owner record and stamp the
  binding inactive in one transaction. Zero Telegram calls. Idempotent across retries.
* **Replay** at leader start: pending intents of a previous leader are finished before followers
  can connect; intents whose binding has been taken over since are cancelled without Telegram calls.
"""

from __future__ import annotations

from collections.abc import Callable

from topicbus.core.clock import Clock
from topicbus.logsetup import EventJournal
from topicbus.core.registry import FollowerRecord
from topicbus.bot.gateway import Outcome, TelegramGateway
from topicbus.storage.bindings import BindingRepository
from topicbus.storage.cleanups import CleanupIntent, CleanupRepository
from topicbus.storage.db import Authority, Database


class CleanupUnconfirmed(Exception):
    """Telegram did not confirm the deletion; the intent and the binding are kept."""


class DepartureHandler:
    def __init__(self, *, db: Database, bindings: BindingRepository, cleanups: CleanupRepository,
                 gateway: TelegramGateway, clock: Clock, events: EventJournal):
        self._db = db
        self._bindings = bindings
        self._cleanups = cleanups
        self._gateway = gateway
        self._clock = clock
        self._events = events

    # --- cleanup (delete) -------------------------------------------------------------------------
    async def cleanup(self, follower: FollowerRecord, authority: Authority, *, reason: str) -> bool:
        """Delete the follower's topic; True when deleted (or already gone), False when superseded."""
        target = follower.target
        if target is None or target.thread_id is None or follower.binding_key is None:
            return False
        if not follower.registration_generation:
            raise CleanupUnconfirmed("Follower cleanup requires an exact registration generation.")
        intent = CleanupIntent(
            id=CleanupIntent.make_id(follower.instance_id, follower.registration_generation, target.chat_id,
                                     target.thread_id),
            binding_key=follower.binding_key, instance_id=follower.instance_id,
            registration_generation=follower.registration_generation, chat_id=target.chat_id,
            thread_id=target.thread_id, reason=reason, requested_at_ms=self._clock.now_ms(),
        )
        async with self._db.write(authority) as tx:
            await CleanupRepository.upsert_tx(tx, intent)
        return await self.apply(intent, authority)

    async def apply(self, intent: CleanupIntent, authority: Authority) -> bool:
        """Carry out one durable intent (also used for replay)."""
        if await self._superseded(intent):
            async with self._db.write(authority) as tx:
                await CleanupRepository.remove_tx(tx, intent.id)
            self._events.record("Cleanup intent superseded by a newer owner; topic kept",
                                phase="cleanup-superseded", intentId=intent.id, threadId=intent.thread_id)
            return False
        closed = await self._gateway.close_topic(intent.chat_id, intent.thread_id)
        if closed.outcome in (Outcome.AMBIGUOUS, Outcome.RETRY_AFTER):
            await self._unconfirmed(intent, authority, f"close: {closed.outcome} {closed.message}")
        deleted = await self._gateway.delete_topic(intent.chat_id, intent.thread_id)
        if deleted.outcome not in (Outcome.OK, Outcome.GONE):
            await self._unconfirmed(intent, authority, f"delete: {deleted.outcome} {deleted.message}")
        async with self._db.write(authority) as tx:
            await BindingRepository.mark_topic_deleted_tx(tx, intent.chat_id, intent.thread_id, self._clock.now_ms())
            await CleanupRepository.remove_tx(tx, intent.id)
        self._events.record("Follower topic cleaned up", phase="follower-confirmed-dead-cleanup"
                            if intent.reason == "confirmed-dead" else "follower-disconnect",
                            instanceId=intent.instance_id, chatId=intent.chat_id, threadId=intent.thread_id)
        return True

    async def _superseded(self, intent: CleanupIntent) -> bool:
        binding = await self._bindings.get(intent.binding_key)
        if binding is None or binding.thread_id != intent.thread_id or binding.topic_state == "deleted":
            return False  # nothing newer holds this topic; deleting a gone topic is confirmed absence
        owner = await self._bindings.owner(intent.binding_key)
        return owner is not None and (owner.instance_id, owner.registration_generation) != (
            intent.instance_id, intent.registration_generation)

    async def _unconfirmed(self, intent: CleanupIntent, authority: Authority, error: str) -> None:
        async with self._db.write(authority) as tx:
            await CleanupRepository.note_error_tx(tx, intent.id, error)
        raise CleanupUnconfirmed(
            "Follower topic deletion was not confirmed; the cleanup intent is kept and retried by the next "
            f"leader start ({error}).")

    async def replay(self, authority: Authority) -> tuple[int, int]:
        """Finish every pending intent; returns (completed, still pending)."""
        done = failed = 0
        for intent in await self._cleanups.all():
            try:
                await self.apply(intent, authority)
                done += 1
            except CleanupUnconfirmed as exc:
                failed += 1
                self._events.record(exc, phase="cleanup-replay", level="WARNING", intentId=intent.id)
        return done, failed

    # --- preservation (detach, keep the topic) -------------------------------------------------------
    async def preserve(self, follower: FollowerRecord, is_detached: Callable[[], bool],
                       authority: Authority) -> bool:
        """Detach the exact owner record and stamp the binding inactive; True when settled."""
        if follower.binding_key is None or not follower.registration_generation:
            return False
        if not is_detached():
            return False
        async with self._db.write(authority) as tx:
            owner = await BindingRepository.owner_tx(tx, follower.binding_key)
            if owner is None or (owner.instance_id, owner.registration_generation) != (
                    follower.instance_id, follower.registration_generation):
                return True  # nothing of ours left to detach: settled
            if not is_detached():  # authority, replacement and death re-checked at the commit
                return False
            await BindingRepository.detach_owner_tx(tx, owner)
            await BindingRepository.mark_inactive_tx(tx, follower.binding_key, self._clock.now_ms())
        return True
