"""Who is live right now: the follower registry, each follower's socket and its delivery route.

The roster keeps three facts in step so that no use case has to: a follower is *published* (in the
registry, its connection known, its delivery route attached) or *dropped* (all three gone), never
half. Followers restored from the previous leader's store are in the registry (so that they can be
pruned and proven dead) but not yet counted as live until they register again.

Use cases ask the roster questions (who is registered, is a binding routed, is its socket open);
its registry and the delivery hub are its own. Use cases that deliver are given the hub itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

from topicbus.core.registry import FollowerRecord, FollowerRegistry
from topicbus.leader.delivery import DeliveryHub
from topicbus.ports.bus import FollowerConnection

PRUNED_CLOSE_CODE = 4002  # the follower reconnects and registers again (docs/protocol.md)


class Roster:
    def __init__(self, hub: DeliveryHub, registry: FollowerRegistry | None = None):
        self._registry = registry if registry is not None else FollowerRegistry()
        self._hub = hub
        self._connections: dict[str, FollowerConnection] = {}  # instance id -> socket
        self._restored: set[str] = set()  # instance ids restored from the store, not registered again yet
        self._closing: set[asyncio.Task[Any]] = set()

    # --- queries ----------------------------------------------------------------------------------
    def get(self, instance_id: str) -> FollowerRecord | None:
        return self._registry.get(instance_id)

    def followers(self) -> list[FollowerRecord]:
        return self._registry.list()

    def __len__(self) -> int:
        return len(self._registry)

    def is_restored(self, instance_id: str) -> bool:
        return instance_id in self._restored

    def live_binding_keys(self) -> set[str]:
        """Bindings with a follower that registered with this leader (restored ones do not count)."""
        return {f.binding_key for f in self._registry.list() if f.binding_key and f.instance_id not in self._restored}

    def is_routed(self, binding_key: str) -> bool:
        """A registered (not pruned) follower with an open socket owns this binding."""
        return self._hub.is_online(binding_key) and self._registry.has_binding(binding_key)

    def is_online(self, binding_key: str) -> bool:
        """This binding has a delivery route whose socket is open (registered or not)."""
        return self._hub.is_online(binding_key)

    def reconnect_due(self, binding_key: str) -> bool:
        """This binding's follower is registered (not pruned) but its socket dropped: it reconnects."""
        return self._registry.has_binding(binding_key) and not self._hub.is_online(binding_key)

    def follower_on(self, connection: FollowerConnection) -> FollowerRecord | None:
        for instance_id, conn in self._connections.items():
            if conn is connection:
                return self._registry.get(instance_id)
        return None

    # --- changes ----------------------------------------------------------------------------------
    def heartbeat(self, instance_id: str, now_ms: int) -> None:
        """The follower is alive now (its liveness clock starts again)."""
        self._registry.heartbeat(instance_id, now_ms)

    def restore(self, record: FollowerRecord) -> None:
        """A follower that owned a topic under the previous leader: prunable, not yet live."""
        self._registry.register(record)
        self._restored.add(record.instance_id)

    def publish(self, record: FollowerRecord, connection: FollowerConnection) -> list[tuple[FollowerRecord, FollowerConnection]]:
        """Publish a registration; returns the older live registrations of the same binding (with
        their sockets), which the caller tells that they were superseded."""
        superseded = []
        for old in self._registry.list():
            if old.instance_id != record.instance_id and old.binding_key == record.binding_key:
                conn = self._connections.pop(old.instance_id, None)
                if conn is not None:
                    self._hub.detach_connection(conn)
                    superseded.append((old, conn))
        self._restored.discard(record.instance_id)
        self._registry.register(record)
        previous = self._connections.get(record.instance_id)
        if previous is not None and previous is not connection:
            self._hub.detach_connection(previous)
        self._connections[record.instance_id] = connection
        self._hub.attach(record.binding_key or "", record.instance_id, record.registration_generation, connection,
                        record.capabilities)
        return superseded

    def drop(self, instance_id: str) -> None:
        """Take a follower out of routing: registry entry, socket and delivery route."""
        self._registry.remove(instance_id)
        self.forget_connection(instance_id)

    def forget_connection(self, instance_id: str) -> None:
        """A follower already pruned from the registry: forget its socket and route."""
        if self._registry.get(instance_id) is not None:
            return
        conn = self._connections.pop(instance_id, None)
        if conn is not None:
            self._hub.detach_connection(conn)

    def pruned(self, record: FollowerRecord) -> None:
        """The pruner took a follower out of the registry (no heartbeat in time): close its socket
        too, so that a peer that stopped reading holds nothing; a live follower reconnects and
        registers again."""
        conn = self._connections.pop(record.instance_id, None)
        if conn is None:
            return
        self._hub.detach_connection(conn)
        task = asyncio.ensure_future(conn.close(PRUNED_CLOSE_CODE, "pruned: no heartbeat in time"))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def connection_closed(self, connection: FollowerConnection) -> None:
        self._hub.detach_connection(connection)
        for instance_id in [i for i, c in self._connections.items() if c is connection]:
            del self._connections[instance_id]

    def drop_binding(self, binding_key: str) -> list[FollowerRecord]:
        """Drop every follower of a binding (its topic is gone); returns them."""
        dropped = [f for f in self._registry.list() if f.binding_key == binding_key]
        for entry in dropped:
            self.drop(entry.instance_id)
        return dropped

    async def close(self) -> None:
        await self._hub.close()
        for conn in list(self._connections.values()):
            try:
                await conn.close(1001, "leader stopping")
            except Exception:  # noqa: BLE001 - the socket may be gone already
                pass
        self._connections.clear()
        self._restored.clear()
        self._registry.clear()
