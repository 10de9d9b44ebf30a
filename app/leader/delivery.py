"""Inbound delivery: journaled owner messages pushed to the follower that owns their binding.

At-least-once: an item leaves the journal only on the follower's receipt; each (re)registration
starts a fresh route (high-water mark 0) so everything unacknowledged is sent again, in journal
order. Receipts are applied in batches: under load one transaction marks many items delivered; a
receipt lost in a crash only means a redelivery, which followers drop by ``deliveryId``.

What a follower is given for each row is the :class:`~topicbus.leader.inbound.InboundScreen`'s
answer (adapted to its capabilities, settled without sending, or held while an album gathers).
Rows a receipt newly settled go to ``on_delivered`` (the receipt reaction). ``send_now`` carries
the items that are never journaled (``control``) to one exact follower generation.

No caller waits on a follower: :meth:`DeliveryHub.deliver_new` (called under the router's journal
lock, inside the poll batch) only hands frames to the connection's send queue, and only while that
queue has room. Everything else — a backlog, a route that is not caught up, a follower that reads
slowly — is sent by the route's own *pump* task, which pages through the journal and waits for the
connection to drain (the connection's write timeout drops a follower that does not read; its items
stay journaled and are sent again when it returns).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from enum import Enum

from loguru import logger

from topicbus.ports.store import Journal
from topicbus.core.clock import Clock
from topicbus.core.records import ControlItem, Deliver, InboundItem, Superseded
from topicbus.leader.inbound import HOLD, InboundScreen
from topicbus.ports.bus import FollowerConnection
from topicbus.protocol import may_deliver
from topicbus.core.authority import Authority
from topicbus.core.journal import JournalItem, parse_delivery_id


PAGE = 500


class _Stop(Enum):
    """Why :meth:`DeliveryHub._send_in_order` stopped."""

    DONE = "done"  # every item given was sent or settled
    HELD = "held"  # the screen holds an item (an album gathering, a voice note being transcribed)
    NO_ROOM = "no-room"  # the connection is congested and the caller does not wait: the pump goes on
    GONE = "gone"  # the route was replaced or its socket failed: the items stay pending


class _Route:
    def __init__(self, instance_id: str, generation: str, connection: FollowerConnection,
                 capabilities: frozenset[str]):
        self.instance_id = instance_id
        self.generation = generation
        self.connection = connection
        self.capabilities = capabilities
        self.high_water = 0  # highest journal seq sent on this route
        self.caught_up = False  # nothing pending beyond high_water, and no pump needed
        self.wanted = 0  # bumped whenever items may be pending beyond high_water
        self.pump: asyncio.Task[int] | None = None
        self.lock = asyncio.Lock()  # one pump (or direct send) at a time


class DeliveryHub:
    def __init__(self, journal: Journal, clock: Clock, authority: Callable[[], Authority], *,
                 screen: InboundScreen | None = None,
                 on_delivered: Callable[[list[JournalItem]], Awaitable[None]] | None = None):
        self._journal = journal
        self._clock = clock
        self._authority = authority
        self._screen = screen or InboundScreen(journal, clock, authority)
        self._on_delivered = on_delivered
        self._routes: dict[str, _Route] = {}  # binding_key -> current route
        self.delivered = 0
        self._receipts: list[tuple[int, str]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.journal_error: str | None = None  # the last failure to record receipts, until one succeeds

    def attach(self, binding_key: str, instance_id: str, generation: str, connection: FollowerConnection,
               capabilities: frozenset[str] = frozenset()) -> None:
        old = self._routes.get(binding_key)
        self._routes[binding_key] = _Route(instance_id, generation, connection, capabilities)
        if old is not None:
            self._stop_pump(old)

    def detach_connection(self, connection: FollowerConnection) -> None:
        for key in [k for k, r in self._routes.items() if r.connection is connection]:
            self._stop_pump(self._routes.pop(key))

    @staticmethod
    def _stop_pump(route: _Route) -> None:
        if route.pump is not None and not route.pump.done() and route.pump is not asyncio.current_task():
            route.pump.cancel()

    def is_online(self, binding_key: str) -> bool:
        route = self._routes.get(binding_key)
        return route is not None and not route.connection.closed

    def _current(self, binding_key: str, route: _Route) -> bool:
        """This route still owns the binding and its socket is open (checked before every send: a
        route replaced while a slow send was in flight sends nothing more)."""
        return self._routes.get(binding_key) is route and not route.connection.closed

    async def kick(self, binding_key: str) -> int:
        """Send every pending item of this binding that this route has not carried yet, in order;
        returns how many this pump sent (it waits for a slow follower, never for long: the
        connection's write timeout drops one that does not read)."""
        route = self._routes.get(binding_key)
        if route is None:
            return 0
        pump = self._want(binding_key, route)
        try:
            return await asyncio.shield(pump)
        except asyncio.CancelledError:
            if pump.cancelled():
                return 0
            raise

    def _want(self, binding_key: str, route: _Route) -> asyncio.Task[int]:
        """Note that items may be pending and make sure the route's pump runs (never awaited here)."""
        route.caught_up = False
        route.wanted += 1
        if route.pump is None or route.pump.done():
            route.pump = asyncio.get_running_loop().create_task(self._pump(binding_key, route),
                                                                name=f"delivery-pump:{binding_key}")
        return route.pump

    async def _pump(self, binding_key: str, route: _Route) -> int:
        sent = 0
        async with route.lock:
            while self._current(binding_key, route):
                seen = route.wanted
                page = await self._journal.pending(binding_key, limit=PAGE, after_seq=route.high_water)
                count, stop = await self._send_in_order(binding_key, route, page, wait_for_room=True)
                sent += count
                if stop is _Stop.HELD:
                    if route.wanted == seen:
                        return sent  # its seal (or release) kicks the route again
                    continue  # kicked while this page was read: the row may have been released since
                if stop is not _Stop.DONE:
                    return sent
                if len(page) < PAGE and route.wanted == seen:
                    route.caught_up = True
                    break
        return sent

    async def deliver_new(self, binding_key: str, items: list[JournalItem]) -> int:
        """Send items just journaled (in seq order) without reading them back, when the route has
        carried everything older and its connection has room; otherwise leave them to the route's
        pump. Never waits on the follower (callers hold the journal lock). Callers serialise journal
        appends, so a caught-up route has nothing pending older than ``items``. Returns how many
        were handed to the connection here."""
        route = self._routes.get(binding_key)
        if route is None:
            return 0
        direct = (route.caught_up and not route.lock.locked() and self._current(binding_key, route)
                  and all(item.seq > route.high_water for item in items))
        if not direct:
            self._want(binding_key, route)
            return 0
        async with route.lock:  # free (checked above): taken without waiting
            sent, stop = await self._send_in_order(binding_key, route, items, wait_for_room=False)
        if stop is _Stop.NO_ROOM:
            self._want(binding_key, route)  # the pump sends the rest once the follower drains
        return sent

    async def _send_in_order(self, binding_key: str, route: _Route, items: list[JournalItem], *,
                             wait_for_room: bool) -> tuple[int, _Stop]:
        """The one send loop (route lock held): each item the screen lets through goes to the
        connection in journal order and moves the route's high-water mark; returns how many were
        sent and why it stopped. A congested connection is waited for (``wait_for_room``: the pump)
        or left (``NO_ROOM``: the caller hands the rest to the pump). Whatever is not sent stays
        pending in the journal."""
        sent = 0
        for item in items:
            if item.seq <= route.high_water:
                continue  # sent directly meanwhile
            if not self._current(binding_key, route):
                return sent, _Stop.GONE
            if route.connection.congested and not wait_for_room:
                return sent, _Stop.NO_ROOM
            prepared = await self._screen.screen(binding_key, route.capabilities, item, route.instance_id)
            if prepared is HOLD:  # an album still gathering, a voice note still transcribed
                route.caught_up = False
                return sent, _Stop.HELD
            if prepared is None:
                route.high_water = item.seq
                continue
            try:
                if route.connection.congested:
                    await route.connection.writable()
                    if not self._current(binding_key, route):
                        return sent, _Stop.GONE
                await route.connection.send_frame(self._frame(route, item, prepared))
            except Exception as exc:  # noqa: BLE001 - a dropped socket; items stay pending
                logger.bind(phase="delivery").debug("delivery send failed: {}", type(exc).__name__)
                route.caught_up = False
                return sent, _Stop.GONE
            route.high_water = item.seq
            sent += 1
        return sent, _Stop.DONE

    @staticmethod
    def _frame(route: _Route, item: JournalItem, payload: InboundItem) -> Deliver:
        return Deliver(item.delivery_id, route.instance_id, route.generation, payload)

    async def send_now(self, binding_key: str, instance_id: str, generation: str, delivery_id: str,
                       item: ControlItem) -> bool:
        """Send an item that is not journaled (``control``) to exactly this follower generation,
        at once; False when that generation is not the binding's live route (or the socket failed,
        or it did not advertise the item's type). Never sent again: a successor never gets it."""
        route = self._routes.get(binding_key)
        if (route is None or route.connection.closed or route.instance_id != instance_id
                or route.generation != generation or not may_deliver(item, route.capabilities)):
            return False
        try:
            await route.connection.send_frame(Deliver(delivery_id, instance_id, generation, item))
        except Exception as exc:  # noqa: BLE001 - a dead socket: the caller says it was not sent
            logger.bind(phase="delivery").debug("control send failed: {}", type(exc).__name__)
            return False
        return True

    async def receipt(self, binding_key: str, delivery_id: str) -> bool:
        """Queue a follower's receipt; applied with others in one transaction, soon."""
        seq = parse_delivery_id(delivery_id)
        if seq is None:
            return False
        self._receipts.append((seq, binding_key))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_receipts(), name="delivery-receipts")
        return True

    async def _flush_receipts(self) -> None:
        while self._receipts:
            batch, self._receipts = self._receipts, []
            try:
                settled = await self._journal.settle_receipts(batch, self._clock.now_ms(), self._authority())
            except Exception as exc:  # noqa: BLE001 - unmarked items are redelivered later, never lost
                self.journal_error = f"receipts not recorded ({type(exc).__name__})"
                logger.bind(phase="delivery").warning("receipts not recorded ({}); items will be redelivered",
                                                      type(exc).__name__)
                return
            self.journal_error = None
            self.delivered += len(settled)
            if settled and self._on_delivered is not None:
                try:
                    await self._on_delivered(settled)
                except Exception as exc:  # noqa: BLE001 - a reaction never costs a receipt
                    logger.bind(phase="delivery").warning("on_delivered failed ({})", type(exc).__name__)

    async def flush(self) -> None:
        """Wait until every queued receipt is recorded (tests, shutdown)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def close(self) -> None:
        for route in list(self._routes.values()):
            self._stop_pump(route)
        await self.flush()
