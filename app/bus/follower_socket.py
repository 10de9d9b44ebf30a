"""One follower's socket on the leader's side of the bus: a bounded send queue drained by its own
writer task, with a write timeout, so that no caller ever waits on a peer (docs/operations.md,
"Connection limits"). It implements the domain's ``FollowerConnection`` port.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Awaitable
from typing import Any

from aiohttp import WSCloseCode, web
from loguru import logger

from topicbus.core.records import Deliver, Superseded
from topicbus.protocol import encode, leader_frame


class SendQueueFull(ConnectionError):
    """The follower's send queue is full: it does not read; the connection is being dropped."""


class FollowerSocket:
    """One follower socket; implements the domain's ``FollowerConnection`` port.

    Frames go into a bounded queue that one writer task drains onto the socket. ``send_frame``
    never waits on the peer: it enqueues, or raises at once when the connection is gone or its
    queue is full. Deliveries should leave room for acknowledgements: the delivery hub stops while
    :attr:`congested` and resumes after :meth:`writable`. A write the peer does not take within the
    write timeout, or a full queue, drops the connection (the transport is aborted: a socket whose
    peer does not read cannot be closed politely).
    """

    def __init__(self, ws: web.WebSocketResponse, transport: asyncio.Transport | None = None, *,
                 queue_bytes: int = 1024 * 1024, write_timeout_s: float = 10.0):
        self._ws = ws
        self._transport = transport
        self._limit = max(queue_bytes, 1)
        self._high = self._limit // 2  # deliveries pause above this; the rest is for answers
        self._low = self._limit // 4
        self._write_timeout = write_timeout_s
        self._queue: deque[str] = deque()
        self._queued = 0
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._empty = asyncio.Event()
        self._empty.set()
        self._aborted = False
        self.close_reason: str | None = None
        self.replays: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()
        self._register_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="bus-writer")

    @property
    def closed(self) -> bool:
        return self._aborted or self._ws.closed

    @property
    def congested(self) -> bool:
        """More than half of the send queue is taken: deliveries wait (see :meth:`writable`)."""
        return self._queued > self._high

    async def send_frame(self, frame: Deliver | Superseded) -> None:
        """Queue one frame the leader pushes (converted to the wire here) for the writer. Never waits on
        the socket."""
        self.enqueue(encode(leader_frame(frame)))

    def enqueue(self, text: str) -> None:
        """Queue one encoded frame (the bus server's answers come this way)."""
        if self.closed:
            raise ConnectionResetError("the follower connection is closed")
        size = len(text.encode())
        if self._queue and self._queued + size > self._limit:
            self.abort(f"its send queue is full ({self._queued // 1024} KiB unread)")
            raise SendQueueFull("the follower does not read; connection dropped")
        self._queue.append(text)
        self._queued += size
        self._empty.clear()
        if self._queued > self._high:
            self._room.clear()
        self._wake.set()

    async def writable(self) -> None:
        """Wait until the queue has drained below a quarter; raises ``ConnectionResetError`` when the
        connection is dropped meanwhile. The writer's timeout bounds the wait."""
        while not self._room.is_set() and not self.closed:
            await self._room.wait()
        if self.closed:
            raise ConnectionResetError("the follower connection is closed")

    async def _write_loop(self) -> None:
        try:
            while True:
                while not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                text = self._queue[0]
                try:
                    async with asyncio.timeout(self._write_timeout):
                        await self._ws.send_str(text)
                except TimeoutError:
                    self.abort(f"it did not read for {self._write_timeout:g}s "
                               f"({self._queued // 1024} KiB waiting)")
                    return
                except Exception as exc:  # noqa: BLE001 - the socket is gone
                    self.abort(f"the write failed ({type(exc).__name__})", quiet=True)
                    return
                self._queue.popleft()
                self._queued -= len(text.encode())
                if not self._queue:
                    self._queued = 0
                    self._empty.set()
                if self._queued <= self._low:
                    self._room.set()
        except asyncio.CancelledError:
            pass

    def expect_registration(self, timeout_s: float) -> None:
        """Close the connection unless a ``follower.register`` arrives within ``timeout_s``."""
        self._register_timer = asyncio.get_running_loop().call_later(timeout_s, self._registration_overdue)

    def registration_started(self) -> None:
        if self._register_timer is not None:
            self._register_timer.cancel()
            self._register_timer = None

    def _registration_overdue(self) -> None:
        self._register_timer = None
        logger.bind(phase="bus-limits").info("closed a bus connection that did not register in time")
        self._spawn(self.close(WSCloseCode.POLICY_VIOLATION, "no registration in time"))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def abort(self, reason: str, *, quiet: bool = False) -> None:
        """Drop the connection now, without waiting on the peer."""
        if self._aborted:
            return
        self._aborted = True
        self.close_reason = reason
        if not quiet:
            logger.bind(phase="bus-slow-peer").warning("dropped a follower connection: {}", reason)
        self._queue.clear()
        self._queued = 0
        self._empty.set()
        self._room.set()
        self._wake.set()
        if self._transport is not None:
            self._transport.abort()
        if self._writer is not asyncio.current_task():
            self._writer.cancel()

    async def close(self, code: int = 1000, message: str = "") -> None:
        """Close politely: what is queued is written first (bounded by the write timeout), then the
        close frame; a peer that does not take them within the timeout is dropped."""
        if self.closed:
            return
        try:
            async with asyncio.timeout(self._write_timeout):
                await self._empty.wait()
                if not self.closed:
                    self._writer.cancel()
                    await self._ws.close(code=code, message=message.encode()[:120])
        except TimeoutError:
            self.abort("it did not take the close frame in time", quiet=True)
        except Exception:  # noqa: BLE001 - the socket is gone already
            self.abort("closing failed", quiet=True)

    def shutdown(self) -> None:
        """The socket is finished (its handler returns): stop the writer and the timers."""
        self.registration_started()
        self._aborted = self._aborted or self._ws.closed
        if not self._writer.done():
            self._writer.cancel()
