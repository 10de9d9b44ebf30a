"""Per-follower serialization: registration, disconnect, rename and confirmed-dead handling for the
same follower identity never interleave.

A follower's key is ``"profile:<profile_key>"`` when it has a profile key, else
``"instance:<instance_id>"``. Operations with the same key run one at a time in arrival order;
operations with different keys run concurrently. A failing (or cancelled) operation releases its
key like a successful one, and a key with nobody running or waiting is forgotten.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from topicbus.core.registry import FollowerRecord

T = TypeVar("T")


def follower_mutation_key(record: FollowerRecord) -> str:
    """The serialization key of a follower: its profile key if it has one, else its instance."""
    if record.profile_key:
        return f"profile:{record.profile_key}"
    return f"instance:{record.instance_id}"


class _KeyGate:
    """A FIFO lock plus the number of operations holding or awaiting it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()  # fair: waiters are woken in arrival order
        self.users = 0


class FollowerMutationQueue:
    """FIFO async exclusion keyed by follower identity."""

    def __init__(self) -> None:
        self._gates: dict[str, _KeyGate] = {}

    async def run(
        self, record_or_key: FollowerRecord | str, op: Callable[[], Awaitable[T]]
    ) -> T:
        """Run ``op`` once every earlier operation for the same key has finished.

        ``record_or_key`` is a follower (its key is derived) or an explicit key string. The
        result or exception of ``op`` is returned or raised unchanged.
        """
        key = (
            record_or_key
            if isinstance(record_or_key, str)
            else follower_mutation_key(record_or_key)
        )
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _KeyGate()
        gate.users += 1
        try:
            async with gate.lock:
                return await op()
        finally:
            gate.users -= 1
            if gate.users == 0 and self._gates.get(key) is gate:
                del self._gates[key]

    def is_busy(self, record_or_key: FollowerRecord | str) -> bool:
        """Whether an operation for this key is running or waiting."""
        return self.users(record_or_key) > 0

    def users(self, record_or_key: FollowerRecord | str) -> int:
        """How many operations for this key are running or waiting."""
        key = record_or_key if isinstance(record_or_key, str) else follower_mutation_key(record_or_key)
        gate = self._gates.get(key)
        return 0 if gate is None else gate.users

    def __len__(self) -> int:
        """Number of keys with an operation running or waiting."""
        return len(self._gates)
