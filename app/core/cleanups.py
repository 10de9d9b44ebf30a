"""Cleanups of finished agents' topics, as the store keeps them.

* :class:`ScheduledCleanup` — a topic kept readable for its grace period; when it falls due and
  nobody took the workspace back, it becomes
* :class:`CleanupIntent` — durable destructive intent, written before any Telegram close/delete."""

from __future__ import annotations

from dataclasses import dataclass

from topicbus.core.target import Target

@dataclass(frozen=True)
class CleanupIntent:
    id: str
    binding_key: str
    instance_id: str
    registration_generation: str
    chat_id: int
    thread_id: int
    reason: str
    requested_at_ms: int
    last_error: str | None = None

    @property
    def target(self) -> Target:
        return Target(self.chat_id, self.thread_id)

    @staticmethod
    def make_id(instance_id: str, generation: str, chat_id: int, thread_id: int) -> str:
        return f"cleanup:{instance_id}:{generation}:{chat_id}:{thread_id}"


@dataclass(frozen=True)
class ScheduledCleanup:
    binding_key: str
    instance_id: str
    registration_generation: str
    chat_id: int
    thread_id: int
    reason: str
    requested_at_ms: int
    due_at_ms: int

    @property
    def target(self) -> Target:
        return Target(self.chat_id, self.thread_id)

    def intent(self) -> CleanupIntent:
        return CleanupIntent(
            id=CleanupIntent.make_id(self.instance_id, self.registration_generation, self.chat_id, self.thread_id),
            binding_key=self.binding_key, instance_id=self.instance_id,
            registration_generation=self.registration_generation, chat_id=self.chat_id, thread_id=self.thread_id,
            reason=self.reason, requested_at_ms=self.requested_at_ms)
