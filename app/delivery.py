"""Inbound delivery: journaled owner messages pushed to the follower that owns their binding.

At-least-once: an item leaves the journal only on the follower's receipt; each (re)registration
starts a fresh in-flight set so everything unacknowledged is sent again, in journal order.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from loguru import logger

from app.clock import Clock
from app.protocol import Kind
from storage.journal import JournalRepository, parse_delivery_id


class FollowerConnection(Protocol):
    """What the bus transport offers the domain for one follower socket."""

    @property
    def closed(self) -> bool: ...

    async def send_frame(self, frame: dict[str, Any]) -> None: ...

    async def close(self, code: int = 1000, message: str = "") -> None: ...


class _Route:
    def __init__(self, instance_id: str, generation: str, connection: FollowerConnection):
        self.instance_id = instance_id
        self.generation = generation
        self.connection = connection
        self.in_flight: set[int] = set()
        self.lock = asyncio.Lock()


class DeliveryHub:
    def __init__(self, journal: JournalRepository, clock: Clock):
        self._journal = journal
        self._clock = clock
        self._routes: dict[str, _Route] = {}  # binding_key -> current route
        self.delivered = 0

    def attach(self, binding_key: str, instance_id: str, generation: str, connection: FollowerConnection) -> None:
        self._routes[binding_key] = _Route(instance_id, generation, connection)

    def detach(self, binding_key: str, instance_id: str | None = None) -> None:
        route = self._routes.get(binding_key)
        if route is not None and (instance_id is None or route.instance_id == instance_id):
            del self._routes[binding_key]

    def detach_connection(self, connection: FollowerConnection) -> None:
        for key in [k for k, r in self._routes.items() if r.connection is connection]:
            del self._routes[key]

    def is_online(self, binding_key: str) -> bool:
        route = self._routes.get(binding_key)
        return route is not None and not route.connection.closed

    async def kick(self, binding_key: str) -> int:
        """Send every pending item of this binding not yet in flight on its current route."""
        route = self._routes.get(binding_key)
        if route is None:
            return 0
        sent = 0
        async with route.lock:
            if self._routes.get(binding_key) is not route or route.connection.closed:
                return 0
            for item in await self._journal.pending(binding_key):
                if item.seq in route.in_flight:
                    continue
                frame = {"kind": Kind.DELIVER.value, "requestId": item.delivery_id, "deliveryId": item.delivery_id,
                         "instanceId": route.instance_id, "registrationGeneration": route.generation,
                         "item": item.payload}
                try:
                    await route.connection.send_frame(frame)
                except Exception as exc:  # noqa: BLE001 - a dead socket; items stay pending
                    logger.bind(phase="delivery").debug("delivery send failed: {}", type(exc).__name__)
                    return sent
                route.in_flight.add(item.seq)
                sent += 1
        return sent

    async def receipt(self, binding_key: str, delivery_id: str) -> bool:
        seq = parse_delivery_id(delivery_id)
        if seq is None:
            return False
        route = self._routes.get(binding_key)
        if route is not None:
            route.in_flight.discard(seq)
        marked = await self._journal.mark_delivered(seq, binding_key, self._clock.now_ms())
        if marked:
            self.delivered += 1
        return marked
