"""Connection hygiene for the bus port: a cap on connections, a deadline for the request head,
eviction of idle unauthenticated connections, and accept errors logged at most once per interval.

The guard works on file descriptors, below HTTP and TLS: the listening socket is a
:class:`GuardedListener` whose ``accept()`` registers every new connection (a
:class:`TrackedSocket` that reports its own ``close()``). asyncio and aiohttp use these sockets as
they use any other (``aiohttp.web.SockSite``), so the guard sees every connection, TLS handshakes
included, and never depends on the HTTP server's internals.

* **Total cap.** At most ``max_connections`` sockets are open. A new connection beyond it takes
  the place of the oldest *idle* unauthenticated one; when there is none, the new one is refused
  (closed at once).
* **Unauthenticated cap.** A connection is *unauthenticated* until one of its requests carries the
  bus secret. Beyond ``max_unauthenticated`` such connections, the oldest idle one is dropped.
  *Idle* means it was open for ``idle_grace_s`` (a quarter second) and nothing is waiting to be
  read on it: a client gets that time to send its request, one that has sent it is about to be
  served and is never pushed out, and silent sockets cannot keep anyone out for longer than their
  grace. While new connections arrive faster than the cap per grace (256 a second with the
  defaults), newcomers are refused at once, so a client may have to try again.
* **Head deadline.** A connection that has not delivered a complete HTTP request head (TLS
  handshake included) within ``head_timeout_s`` is dropped.
* **Accept errors.** When the process runs out of file descriptors, asyncio pauses accepting for
  a second and reports the error; the guard turns the burst of reports into one line per interval.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_ERROR_MESSAGE = "socket.accept() out of system resource"
LOG_INTERVAL_S = 60.0
FD_RESERVE = 100  # descriptors kept for the database, Telegram's HTTP pool, logs


class Throttle:
    """At most one log line per key and interval; the lines in between are counted, not lost."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self._interval = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, key: str, emit: Callable[[str], None], message: str) -> bool:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        more = self._suppressed.pop(key, 0)
        emit(message + (f" ({more} more since the last report)" if more else ""))
        return True


@dataclass(eq=False)
class _Record:
    sock: TrackedSocket
    fd: int
    opened_at: float
    authenticated: bool = False
    head_seen: bool = False
    dropped: bool = False
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class TrackedSocket(socket.socket):
    """An accepted connection that tells the guard when it is closed."""

    guard_record: _Record | None = None
    guard: ConnectionGuard | None = None

    def close(self) -> None:
        record, guard = self.guard_record, self.guard
        self.guard_record = None
        if record is not None and guard is not None:
            guard._closed(record)
        super().close()


class GuardedListener(socket.socket):
    """The bus's listening socket: every accepted connection goes through the guard."""

    guard: ConnectionGuard

    def accept(self) -> tuple[socket.socket, Any]:
        guard = self.guard
        if guard.accept_paused:
            # asyncio keeps calling accept() after an EMFILE in the same loop tick; one report per
            # pause is enough (it has already scheduled the retry).
            guard.accept_paused = False
            raise BlockingIOError(errno.EAGAIN, "accepting paused")
        try:
            fd, addr = self._accept()  # type: ignore[attr-defined]
        except OSError as exc:
            if exc.errno in ACCEPT_ERRNOS:
                guard.accept_paused = True
            raise
        conn = TrackedSocket(self.family, self.type, self.proto, fileno=fd)
        if not guard.admit(conn):
            conn.close()
            raise ConnectionAbortedError(errno.ECONNABORTED, "connection limit reached")
        return conn, addr


class ConnectionGuard:
    def __init__(self, *, max_connections: int, max_unauthenticated: int, head_timeout_s: float,
                 idle_grace_s: float = 0.25, clock: Callable[[], float] = time.monotonic,
                 throttle: Throttle | None = None):
        self.max_connections = max_connections
        self.max_unauthenticated = max(1, min(max_unauthenticated, max_connections))
        self.head_timeout_s = head_timeout_s
        self.idle_grace_s = min(idle_grace_s, head_timeout_s)
        self._clock = clock
        self._throttle = throttle or Throttle()
        self._open: dict[int, _Record] = {}  # fd -> record, every open connection
        self._unauthenticated: OrderedDict[int, _Record] = OrderedDict()  # oldest first
        self.accept_paused = False
        self.accept_errors = 0
        self.dropped_idle = 0
        self.refused = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- figures ---------------------------------------------------------------------------------
    @property
    def open_connections(self) -> int:
        return len(self._open)

    @property
    def unauthenticated(self) -> int:
        return len(self._unauthenticated)

    # --- listening -------------------------------------------------------------------------------
    def listeners(self, host: str, port: int) -> list[GuardedListener]:
        """Bound (not yet listening) sockets for ``host``/``port``, one per address family, like
        ``loop.create_server`` would make. Raises ``OSError`` when the port is taken."""
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen, sockets = set(), []
        try:
            for family, type_, proto, _, address in infos:
                if (family, address) in seen:
                    continue
                seen.add((family, address))
                sock = GuardedListener(family, type_, proto)
                sock.guard = self
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        return sockets

    def install_accept_error_handler(self, loop: asyncio.AbstractEventLoop) -> None:
        """Report asyncio's accept errors (file descriptors exhausted) at most once per interval."""
        previous = loop.get_exception_handler()

        def handler(loop_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if context.get("message") == ACCEPT_ERROR_MESSAGE:
                self.accept_errors += 1
                exc = context.get("exception")
                reason = getattr(exc, "strerror", None) or type(exc).__name__
                self._throttle("accept", logger.bind(phase="bus-accept").warning,
                               f"the bus cannot accept connections: {reason}; accepting resumes in 1 s "
                               f"({self.open_connections} bus connections open)")
                return
            if previous is not None:
                previous(loop_, context)
            else:
                loop_.default_exception_handler(context)

        loop.set_exception_handler(handler)

    # --- connections -----------------------------------------------------------------------------
    def admit(self, sock: TrackedSocket) -> bool:
        """A new connection: make room by the rules in the module docstring, or refuse it."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        full = len(self._open) >= self.max_connections
        if full or len(self._unauthenticated) >= self.max_unauthenticated:
            victim = self._idle_unauthenticated()
            if victim is None:
                self.refused += 1
                what = (f"{self.max_connections} connections are open (TOPICBUS_BUS_MAX_CONNECTIONS)" if full else
                        f"{self.max_unauthenticated} unauthenticated connections are busy "
                        "(TOPICBUS_BUS_MAX_UNAUTHENTICATED)")
                self._throttle("refused", logger.bind(phase="bus-limits").warning,
                               f"refused a connection: {what}, none of them idle")
                return False
            self._drop(victim, "connection limit" if full else "unauthenticated limit")
        record = _Record(sock, sock.fileno(), self._clock())
        sock.guard, sock.guard_record = self, record
        self._open[record.fd] = record
        self._unauthenticated[record.fd] = record
        record.timer = self._loop.call_later(self.head_timeout_s, self._head_overdue, record)
        return True

    def head_received(self, transport: asyncio.BaseTransport | None) -> None:
        record = self._record(transport)
        if record is not None and not record.head_seen:
            record.head_seen = True
            if record.timer is not None:
                record.timer.cancel()
                record.timer = None

    def authenticated(self, transport: asyncio.BaseTransport | None) -> None:
        record = self._record(transport)
        if record is not None and not record.authenticated:
            record.authenticated = True
            self._unauthenticated.pop(record.fd, None)

    def _record(self, transport: asyncio.BaseTransport | None) -> _Record | None:
        if transport is None:
            return None
        sock = transport.get_extra_info("socket")
        try:
            fd = sock.fileno() if sock is not None else -1
        except (OSError, ValueError):
            return None
        return self._open.get(fd)

    def _idle_unauthenticated(self) -> _Record | None:
        """The oldest unauthenticated connection that had ``idle_grace_s`` to send its request and
        has nothing waiting to be read: one that has sent bytes the server has not read yet is
        about to be served, and is passed over; a younger one still gets its chance."""
        settled = self._clock() - self.idle_grace_s
        for record in self._unauthenticated.values():
            if record.opened_at > settled:
                return None  # this one and every later one are younger
            try:
                waiting = record.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return record  # silent
            except OSError:
                return record  # broken
            if not waiting:
                return record  # closed by the peer
        return None

    def _head_overdue(self, record: _Record) -> None:
        record.timer = None
        if not record.head_seen and not record.dropped:
            self._drop(record, "request head deadline")

    def _drop(self, record: _Record, why: str) -> None:
        """Shut the connection down; its transport sees end-of-file and closes it (and the guard
        forgets it in ``close()``)."""
        if record.dropped:
            return
        record.dropped = True
        self.dropped_idle += 1
        # Forgotten at once: its descriptor is released when its transport closes it, one loop
        # iteration later, and cannot be handed to another connection before that.
        if self._open.get(record.fd) is record:
            del self._open[record.fd]
        self._unauthenticated.pop(record.fd, None)
        if record.timer is not None:
            record.timer.cancel()
            record.timer = None
        try:
            record.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._throttle("dropped", logger.bind(phase="bus-limits").info,
                       f"dropped an idle connection ({why}); {self.dropped_idle} dropped so far")

    def _closed(self, record: _Record) -> None:
        if record.timer is not None:
            record.timer.cancel()
            record.timer = None
        if self._open.get(record.fd) is record:
            del self._open[record.fd]
        if self._unauthenticated.get(record.fd) is record:
            del self._unauthenticated[record.fd]


def effective_max_connections(configured: int) -> int:
    """The configured cap, lowered to what the process's file descriptor limit allows."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return configured
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return configured
    room = soft - FD_RESERVE if soft > 2 * FD_RESERVE else soft // 2
    return max(2, min(configured, room))
