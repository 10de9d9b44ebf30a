"""Workspace bindings (a workspace's topic, slot and names) and their routable owner records,
as the store keeps them."""

from __future__ import annotations

from dataclasses import dataclass

from topicbus.core.target import Target

@dataclass(frozen=True)
class Binding:
    binding_key: str
    kind: str  # 'leader' | 'follower'
    host_id: str
    cwd: str
    session: str
    slot: str | None
    chat_id: int
    thread_id: int | None
    topic_state: str  # 'open' | 'closed' | 'deleted'
    thread_name: str
    manual_name: str | None
    display_title: str | None
    inactive_since_ms: int | None
    offline_notified: bool
    created_at_ms: int
    updated_at_ms: int

    @property
    def target(self) -> Target:
        return Target(self.chat_id, self.thread_id)

    @property
    def has_live_topic(self) -> bool:
        return self.thread_id is not None and self.topic_state != "deleted"

    @property
    def title(self) -> str:
        return self.display_title or self.thread_name


@dataclass(frozen=True)
class OwnerRecord:
    binding_key: str
    instance_id: str
    registration_generation: str
    pid: int | None
    process_birth_id: str | None
    host_id: str | None
    updated_at_ms: int
