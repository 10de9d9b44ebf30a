"""The leader's in-memory follower registry: who is live right now, and where they post.

The registry is routing authority only. It knows nothing about Telegram, SQLite or the bus
transport; its clock values are passed in by the caller. Besides the live entries it keeps a set
of *unregistered observations*: handles for followers that were pruned from routing and whose
topic may still need a non-destructive preservation step. An observation stays current until a
live registration overlaps its follower (or it is released, or the registry is cleared); it
watches replacement only, never process death or delivery authority.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

from topicbus.core.target import Target


@dataclass(slots=True)
class FollowerRecord:
    """A registered follower as the leader sees it (registration plus liveness clock)."""

    instance_id: str
    registration_generation: str
    pid: int | None = None
    process_birth_id: str | None = None
    host_id: str | None = None
    profile_key: str | None = None
    target: Target | None = None
    slot: str | None = None
    cwd: str | None = None
    session: str | None = None
    name: str | None = None
    thread_name: str | None = None
    binding_key: str | None = None
    capabilities: frozenset[str] = field(default_factory=frozenset)
    connected_at_ms: int = 0
    last_heartbeat_ms: int = 0

    def copy(self) -> FollowerRecord:
        """Return an independent copy (every field value is immutable)."""
        return dataclasses.replace(self)


def overlaps(first: FollowerRecord, second: FollowerRecord) -> bool:
    """Whether ``first`` claims part of ``second``'s identity.

    True for the same instance id, for an equal profile key when ``first`` has one, or for the
    same exact chat and thread when ``first`` has a target. The rule is asymmetric: only the
    first record's profile key and target are consulted. Two targets without a thread id in
    the same chat are the same target (a private chat).
    """
    if first.instance_id == second.instance_id:
        return True
    if first.profile_key is not None and first.profile_key == second.profile_key:
        return True
    if first.target is not None and second.target is not None:
        return (
            first.target.chat_id == second.target.chat_id
            and first.target.thread_id == second.target.thread_id
        )
    return False


class UnregisteredObservation:
    """Handle on a follower that left the registry; current until a live entry replaces it."""

    __slots__ = ("_current", "_registry", "follower")

    def __init__(self, registry: FollowerRegistry, follower: FollowerRecord, current: bool) -> None:
        self._registry = registry
        self._current = current
        self.follower = follower

    def is_current(self) -> bool:
        """True while no overlapping registration, ``clear()`` or ``release()`` happened."""
        return self._current

    def release(self) -> None:
        """Make this observation non-current and stop tracking it (idempotent)."""
        self._current = False
        self._registry._observations.pop(self, None)

    def _invalidate(self) -> None:
        self._current = False


class FollowerRegistry:
    """Live followers keyed by instance id, in registration order, plus pending observations."""

    def __init__(self) -> None:
        self._followers: dict[str, FollowerRecord] = {}
        # Insertion-ordered set of current observations (values unused).
        self._observations: dict[UnregisteredObservation, None] = {}

    def register(self, record: FollowerRecord) -> FollowerRecord:
        """Publish ``record`` as live and return a copy of the stored entry.

        Every other entry that ``record`` overlaps is dropped. A same-instance entry keeps its
        position and its ``last_heartbeat_ms`` (re-registration never refreshes liveness); a new
        entry starts its heartbeat clock at ``record.connected_at_ms``. Finally every pending
        observation the new entry overlaps becomes non-current and is forgotten.
        """
        existing = self._followers.get(record.instance_id)
        for instance_id in [
            other_id
            for other_id, other in self._followers.items()
            if other_id != record.instance_id and overlaps(record, other)
        ]:
            del self._followers[instance_id]
        entry = record.copy()
        entry.last_heartbeat_ms = (
            existing.last_heartbeat_ms if existing is not None else record.connected_at_ms
        )
        self._followers[record.instance_id] = entry
        for observation in [o for o in self._observations if overlaps(entry, o.follower)]:
            observation._invalidate()
            del self._observations[observation]
        return entry.copy()

    def heartbeat(self, instance_id: str, now_ms: int) -> FollowerRecord | None:
        """Stamp a live follower's heartbeat; ``None`` when the instance is not registered."""
        entry = self._followers.get(instance_id)
        if entry is None:
            return None
        entry.last_heartbeat_ms = now_ms
        return entry.copy()

    def get(self, instance_id: str) -> FollowerRecord | None:
        """A copy of the live entry for ``instance_id``, if any."""
        entry = self._followers.get(instance_id)
        return entry.copy() if entry is not None else None

    def get_by_target(self, target: Target) -> FollowerRecord | None:
        """The first live entry whose target has exactly this chat and thread id."""
        for entry in self._followers.values():
            if (
                entry.target is not None
                and entry.target.chat_id == target.chat_id
                and entry.target.thread_id == target.thread_id
            ):
                return entry.copy()
        return None

    def list(self) -> list[FollowerRecord]:
        """Copies of all live entries, in insertion order."""
        return [entry.copy() for entry in self._followers.values()]

    def remove(self, instance_id: str) -> bool:
        """Drop a live entry; True when there was one."""
        return self._followers.pop(instance_id, None) is not None

    def clear(self) -> None:
        """Drop every live entry and invalidate every pending observation."""
        self._followers.clear()
        for observation in self._observations:
            observation._invalidate()
        self._observations.clear()

    def prune_stale(self, now_ms: int, stale_after_ms: int) -> builtins.list[FollowerRecord]:  # `list` here is the method above
        """Remove and return (in insertion order) entries whose heartbeat is strictly too old."""
        stale = [
            instance_id
            for instance_id, entry in self._followers.items()
            if now_ms - entry.last_heartbeat_ms > stale_after_ms
        ]
        return [self._followers.pop(instance_id) for instance_id in stale]

    def observe_unregistered(self, record: FollowerRecord) -> UnregisteredObservation:
        """Start watching a follower that is no longer live for replacement.

        The observation is current at creation only if no live entry overlaps the follower;
        only current observations are tracked (and later invalidated by registrations).
        """
        current = not any(overlaps(live, record) for live in self._followers.values())
        observation = UnregisteredObservation(self, record.copy(), current)
        if current:
            self._observations[observation] = None
        return observation

    def pending_observation_count(self) -> int:
        """How many current observations the registry is tracking."""
        return len(self._observations)

    def has_binding(self, binding_key: str) -> bool:
        """Whether a live entry owns this workspace binding (no copies: on the routing hot path)."""
        return any(entry.binding_key == binding_key for entry in self._followers.values())

    def __iter__(self) -> Iterator[FollowerRecord]:
        return iter(self.list())

    def __len__(self) -> int:
        return len(self._followers)

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._followers
